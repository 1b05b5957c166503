"""loss.draft_vocab: the training softmax over the most supervised token ids, against a
plain-torch reference (materialised logits over those rows), and equal to the full
softmax when the set is the whole vocabulary."""
import numpy as np
import pytest
import torch

from dflash.data.format import DatasetWriter
from dflash.errors import ConfigError
from dflash.model.draft_vocab import DraftVocab
from dflash.model.loss import Objective, block_embeddings, block_targets, drafter_loss
from tests.helpers.models import loss_batch, tiny_drafter, tiny_target


def test_counts_only_supervised_tokens_of_the_training_samples(tmp_path):
    w = DatasetWriter(tmp_path / "d", vocab_size=10)
    w.add([1, 2, 3, 3], [0, 1, 1, 1])
    w.add([4, 4, 5], [1, 1, 0])
    w.add([7, 7, 7], [1, 1, 1])  # held out: not counted with num_samples=2
    ds = w.close()
    counts = ds.supervised_counts(2, chunk=3)  # chunks smaller than a sample
    assert counts.dtype == np.int64
    assert counts.tolist() == [0, 0, 1, 2, 2, 0, 0, 0, 0, 0]
    assert ds.supervised_counts()[7] == 3


def test_most_frequent_ids_ties_by_lower_id():
    v = DraftVocab.most_frequent(np.array([0, 5, 2, 5, 0, 1], dtype=np.int64), 4)
    assert sorted(v.ids.tolist()) == [1, 2, 3, 5]
    assert v.coverage == pytest.approx(13 / 13)
    assert DraftVocab.most_frequent(np.array([0, 5, 2, 5, 0, 1]), 2).coverage == pytest.approx(10 / 13)
    # never-supervised ids fill the set past the supervised ones, lowest id first
    assert sorted(DraftVocab.most_frequent(np.array([0, 0, 3, 0]), 2).ids.tolist()) == [0, 2]
    rows, inside = v.targets(torch.tensor([3, 4, 5]))
    assert inside.tolist() == [True, False, True]
    assert v.full_ids(rows[inside]).tolist() == [3, 5]


def _batch():
    target = tiny_target()
    return (target, tiny_drafter(target, layers=2), *loss_batch(target))


def _matches_reference(drafter, loss, grads, ref):
    """`loss` equals the materialised reference `ref`, and `grads` its gradients."""
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    drafter.zero_grad()
    ref.backward()
    for k, p in drafter.named_parameters():
        torch.testing.assert_close(grads[k], p.grad, rtol=1e-4, atol=1e-7, msg=k)


def _grads(drafter, out):
    drafter.zero_grad()
    out.loss.backward()
    return {k: p.grad.clone() for k, p in drafter.named_parameters()}


@pytest.mark.parametrize("kind", ["ce", "dpace"])
def test_whole_vocabulary_as_draft_vocab_equals_the_full_softmax(kind):
    target, drafter, ids, mask, valid, anchors, ctx = _batch()
    V = target.vocab_size
    args = (drafter, ctx, target.embed_tokens, target.lm_head_weight, ids, mask, valid)
    full = drafter_loss(*args, Objective(6, kind=kind, norm="batch", chunk=16), anchors=anchors)
    g_full = _grads(drafter, full)
    # counts that reorder every row: the set is the whole vocabulary in another order
    vocab = DraftVocab.most_frequent(np.random.default_rng(0).permutation(V), V)
    sub = drafter_loss(*args, Objective(6, kind=kind, norm="batch", chunk=16, vocab=vocab),
                       anchors=anchors)
    torch.testing.assert_close(sub.loss, full.loss, rtol=1e-5, atol=1e-6)
    assert torch.equal(sub.acc, full.acc) and torch.equal(sub.accept_len, full.accept_len)
    for k, grad in _grads(drafter, sub).items():
        torch.testing.assert_close(grad, g_full[k], rtol=1e-4, atol=1e-7, msg=k)


def test_subset_loss_and_gradient_equal_the_plain_torch_reference():
    target, drafter, ids, mask, valid, anchors, ctx = _batch()
    keep = torch.unique(ids[mask])[::2].contiguous()  # half the supervised ids: the others are misses
    counts = np.zeros(target.vocab_size, dtype=np.int64)
    counts[keep.numpy()] = 1
    vocab = DraftVocab.most_frequent(counts, len(keep))
    ob = Objective(6, norm="batch", chunk=16, vocab=vocab)
    out = drafter_loss(drafter, ctx, target.embed_tokens, target.lm_head_weight, ids, mask,
                       valid, ob, anchors=anchors)
    got = _grads(drafter, out)
    # the reference: logits over the kept rows only, every one materialised
    bs = drafter.spec.block_size
    emb = block_embeddings(target.embed_tokens, ids, anchors[0], bs, drafter.spec.mask_token_id)
    hidden = drafter(ctx, valid, anchors[0], anchors[1], emb)[:, :, 1:]
    targets, sup = block_targets(ids, mask, valid, anchors[0], anchors[1], bs)
    inside = torch.isin(targets, keep) & sup
    logits = hidden @ target.lm_head_weight[keep].t()
    row = torch.searchsorted(keep, torch.where(inside, targets, keep[0]))
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 2), row.flatten(),
                                           reduction="none").view_as(sup)
    w = torch.exp(-(torch.arange(1, bs).float() - 1) / 7.0) * inside
    ref = (ce * w).sum() / w.sum()
    _matches_reference(drafter, out.loss, got, ref)
    # accuracy over every supervised position: a target outside the set is a miss
    hit = (keep[logits.argmax(-1)] == targets) & inside
    torch.testing.assert_close(out.acc, hit.sum((0, 1)) / sup.sum((0, 1)).clamp_min(1))
    assert inside.sum() < sup.sum()


def test_a_size_that_is_no_token_count_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="loss.draft_vocab=-1"):
        DraftVocab.most_frequent(np.ones(8, dtype=np.int64), -1)


def test_distillation_over_a_draft_vocabulary_equals_torch_kl_over_its_rows():
    """loss=kl with a draft vocabulary: both distributions over the kept rows only (the
    target's renormalised there), against torch's KL over materialised logits; the
    accuracy maps the argmax back to full ids."""
    import torch.nn.functional as F
    target = tiny_target()
    drafter = tiny_drafter(target, layers=2)
    ids, mask, valid, anchors, _ = loss_batch(target)
    ctx = target.context(ids, valid.long(), final=True)
    keep = torch.unique(ids[mask])[::2].contiguous()
    counts = np.zeros(target.vocab_size, dtype=np.int64)
    counts[keep.numpy()] = 1
    ob = Objective(6, kind="kl", norm="batch", chunk=16,
                   vocab=DraftVocab.most_frequent(counts, len(keep)))
    out = drafter_loss(drafter, ctx, target.embed_tokens, target.lm_head_weight, ids, mask,
                       valid, ob, anchors=anchors)
    got = _grads(drafter, out)
    h, bs = target.hidden_size, drafter.spec.block_size
    emb = block_embeddings(target.embed_tokens, ids, anchors[0], bs, drafter.spec.mask_token_id)
    hidden = drafter(ctx[..., :-h], valid, anchors[0], anchors[1], emb)[:, :, 1:]
    pos = (anchors[0][:, :, None] + torch.arange(bs - 1)).clamp(max=ids.shape[1] - 1)
    final = torch.stack([ctx[b, :, -h:][pos[b]] for b in range(len(ids))])
    head = target.lm_head_weight[keep]
    kl = F.kl_div(F.log_softmax(hidden @ head.t(), -1), F.log_softmax(final @ head.t(), -1),
                  log_target=True, reduction="none").sum(-1)
    targets, sup = block_targets(ids, mask, valid, anchors[0], anchors[1], bs)
    w = torch.exp(-(torch.arange(1, bs).float() - 1) / 7.0) * sup
    ref = (kl * w).sum() / w.sum()
    _matches_reference(drafter, out.loss, got, ref)
    hit = (keep[(hidden @ head.t()).argmax(-1)] == targets) & sup
    torch.testing.assert_close(out.acc, hit.sum((0, 1)) / sup.sum((0, 1)).clamp_min(1))
