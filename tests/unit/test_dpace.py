"""loss=dpace: D-PACE's position weights from the drafter's own detached CE, against a
plain-torch implementation of the paper's formula (materialised logits, loops)."""
import pytest
import torch
from omegaconf import OmegaConf

from dflash.config import DrafterConfig
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.loss import (Objective, block_embeddings, block_targets, dpace_weights,
                               drafter_loss)
from tests.helpers.models import loss_batch, tiny_target


def _reference_weights(ce, sup, a):
    """w_j = sum_{m>=j} prod_{i<=m} ((1-a) q_i + a), q_i = exp(-CE_i), per block,
    over the block's supervised prefix (a draft stops at its first miss)."""
    w = torch.zeros_like(ce)
    for b in range(ce.shape[0]):
        for j in range(ce.shape[1]):
            n = 0
            while n < ce.shape[2] and sup[b, j, n]:
                n += 1
            for p in range(n):
                total = 0.0
                for m in range(p, n):
                    prod = 1.0
                    for i in range(m + 1):
                        prod *= (1 - a) * float(torch.exp(-ce[b, j, i])) + a
                    total += prod
                w[b, j, p] = total
    return w


def test_weights_follow_the_formula():
    g = torch.Generator().manual_seed(0)
    ce = torch.rand(2, 3, 7, generator=g) * 4
    sup = torch.ones(2, 3, 7, dtype=torch.bool)
    sup[0, 1, 4:] = False  # the reply ends inside the block
    sup[1, 2, 2] = False  # a gap: nothing after it counts
    torch.testing.assert_close(dpace_weights(ce, sup, 0.5), _reference_weights(ce, sup, 0.5))
    # a perfect drafter (q = 1) weighs position j by the positions left: bs-1-j
    assert dpace_weights(torch.zeros(1, 1, 5), torch.ones(1, 1, 5, dtype=torch.bool),
                         0.5).tolist() == [[[5.0, 4.0, 3.0, 2.0, 1.0]]]


@pytest.mark.parametrize("layers", [1, 2])
def test_gradient_equals_the_plain_torch_formula(layers):
    target = tiny_target()
    torch.manual_seed(0)
    drafter = DFlashDrafter(DrafterSpec.from_target(
        target, OmegaConf.structured(DrafterConfig(num_layers=layers))))
    ids, mask, valid, anchors, ctx = loss_batch(target)
    ob = Objective(6, kind="dpace", norm="batch", chunk=16)
    out = drafter_loss(drafter, ctx, target.embed_tokens, target.lm_head_weight, ids, mask, valid,
                       ob, anchors=anchors)
    out.loss.backward()
    got = {k: p.grad.clone() for k, p in drafter.named_parameters()}
    drafter.zero_grad()
    # the reference: every logit materialised, the formula in loops
    bs = drafter.spec.block_size
    emb = block_embeddings(target.embed_tokens, ids, anchors[0], bs, drafter.spec.mask_token_id)
    hidden = drafter(ctx, valid, anchors[0], anchors[1], emb)[:, :, 1:]
    targets, sup = block_targets(ids, mask, valid, anchors[0], anchors[1], bs)
    logits = hidden @ target.lm_head_weight.t()
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 2), torch.where(sup, targets, 0).flatten(),
                                           reduction="none").view_as(sup)
    w = _reference_weights(ce.detach(), sup, 0.5)
    ref = (ce * w).sum() / w.sum()
    torch.testing.assert_close(out.loss, ref, rtol=1e-5, atol=1e-6)
    ref.backward()
    for k, p in drafter.named_parameters():
        torch.testing.assert_close(got[k], p.grad, rtol=1e-4, atol=1e-7, msg=k)
    # and it is not the CE objective's gradient
    drafter.zero_grad()
    drafter_loss(drafter, ctx, target.embed_tokens, target.lm_head_weight, ids, mask, valid,
                 Objective(6, norm="batch"), anchors=anchors).loss.backward()
    assert not torch.allclose(drafter.fc.weight.grad, got["fc.weight"], rtol=1e-3)
