"""loss=kl: distillation to the target's next-token distribution, chunked through the
frozen LM head, against materialised logits and torch's own KL."""
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from dflash.config import DrafterConfig
from dflash.kernels import fused_lm_head_kl_rows
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.loss import (Objective, block_embeddings, block_targets, drafter_loss,
                               position_weights, sample_anchors)
from tests.helpers.models import tiny_target


@pytest.mark.parametrize("temperature,chunk", [(1.0, 7), (2.0, 0)])
def test_rows_and_gradient_equal_torch_kl(temperature, chunk):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(19, 16, generator=g, requires_grad=True)
    ht = torch.randn(19, 16, generator=g)
    w = torch.randn(50, 16, generator=g)
    weights = torch.rand(19, generator=g)
    rows, arg = fused_lm_head_kl_rows(h, ht, w, temperature, chunk=chunk)
    (rows * weights).sum().backward()
    got = h.grad.clone()
    h.grad = None
    t = temperature
    ref = F.kl_div(F.log_softmax(h @ w.t() / t, -1), F.log_softmax(ht @ w.t() / t, -1),
                   log_target=True, reduction="none").sum(-1) * t * t
    (ref * weights).sum().backward()
    torch.testing.assert_close(rows, ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, h.grad, rtol=1e-5, atol=1e-6)
    assert torch.equal(arg, (h @ w.t()).argmax(-1))


def test_the_final_hidden_state_rides_along_the_context():
    target = tiny_target()
    ids = torch.randint(3, 500, (2, 17))
    both = target.context(ids, final=True)
    h = target.hidden_size
    torch.testing.assert_close(both[..., :-h], target.context(ids))
    ref = target.lm(ids, output_hidden_states=True).hidden_states[-1]  # after the final norm
    torch.testing.assert_close(both[..., -h:], ref)


def test_block_position_k_is_scored_against_the_target_at_anchor_plus_k_minus_1():
    target = tiny_target()
    torch.manual_seed(0)
    drafter = DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig())))
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 500, (2, 50), generator=g)
    valid = torch.ones_like(ids, dtype=torch.bool)
    mask = valid & (torch.arange(50)[None] >= 10)
    anchors = sample_anchors(mask, valid, 5, torch.Generator().manual_seed(4))
    ctx = target.context(ids, valid.long(), final=True)
    out = drafter_loss(drafter, ctx, target.embed_tokens, target.lm_head_weight, ids, mask, valid,
                       Objective(5, kind="kl", norm="batch"), anchors=anchors)
    # the reference: the target's own logits at anchor + k - 1, every logit materialised
    bs = drafter.spec.block_size
    emb = block_embeddings(target.embed_tokens, ids, anchors[0], bs, drafter.spec.mask_token_id)
    hidden = drafter(ctx[..., :-target.hidden_size], valid, anchors[0], anchors[1], emb)[:, :, 1:]
    logits_t = target.lm(ids).logits  # [B, S, V]
    _, sup = block_targets(ids, mask, valid, anchors[0], anchors[1], bs)
    pos = (anchors[0][:, :, None] + torch.arange(bs - 1)).clamp(max=49)
    lt = torch.stack([logits_t[b][pos[b]] for b in range(2)])
    kl = F.kl_div(F.log_softmax(hidden @ target.lm_head_weight.t(), -1), F.log_softmax(lt, -1),
                  log_target=True, reduction="none").sum(-1)
    wts = position_weights(bs, 7.0) * sup
    torch.testing.assert_close(out.loss, (kl * wts).sum() / wts.sum(), rtol=1e-4, atol=1e-5)
