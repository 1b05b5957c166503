"""batching=packed, the leakage tests: no document in a packed row changes anything of
another one, for the target context, the drafter's outputs, its loss and its gradients."""
import pytest
import torch
from omegaconf import OmegaConf

from dflash.config import DrafterConfig, TargetConfig
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.loss import block_embeddings, block_targets, sample_anchors
from dflash.model.target import Target
from tests.helpers.models import packed_row as _row

DOCS = [list(range(3, 40)), list(range(100, 121)), list(range(200, 250))]


@pytest.fixture(scope="module")
def target():
    return Target.from_config(OmegaConf.structured(TargetConfig(dtype="float32")))




@pytest.mark.parametrize("attn", ["sdpa", "eager", "flex_attention"])
def test_target_context_of_a_packed_row_equals_each_document_alone(attn):
    """Every HF kernel a user can pick with model.target.attn_implementation reads the
    documents from the restarting position ids."""
    target = Target.from_config(OmegaConf.structured(
        TargetConfig(dtype="float32", attn_implementation=attn)))
    assert target.config._attn_implementation == attn
    ids, pos, _, spans = _row(DOCS, 128)
    packed = target.context(ids, None, pos)
    for d, (lo, hi) in zip(DOCS, spans):
        alone = target.context(torch.tensor([d]))
        torch.testing.assert_close(packed[:, lo:hi], alone, rtol=1e-5, atol=1e-5)


def _drafter(target):
    torch.manual_seed(0)
    return DFlashDrafter(DrafterSpec.from_target(
        target, OmegaConf.structured(DrafterConfig(num_layers=2))))


def _per_doc_losses(target, drafter, docs, anchors_pair, row_len=128):
    """Loss of the blocks anchored in each document (one scalar per document), with the
    same anchors every time, through the target, the drafter and the LM head."""
    ids, pos, valid, spans = _row(docs, row_len)
    ctx = target.context(ids, None, pos)
    anchors, ok = anchors_pair
    emb = block_embeddings(target.embed_tokens, ids, anchors, drafter.spec.block_size,
                           drafter.spec.mask_token_id)
    out = drafter(ctx, valid, anchors, ok, emb, pos)
    tgt, sup = block_targets(ids, valid, valid, anchors, ok, drafter.spec.block_size, pos)
    logits = out[:, :, 1:] @ target.lm_head_weight.t()
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 2), tgt.flatten(), reduction="none")
    ce = (ce.view_as(sup) * sup).sum(-1)[0]  # per block
    doc_of = torch.tensor([next(i for i, (lo, hi) in enumerate(spans) if lo <= a < hi)
                           for a in anchors[0].tolist()])
    return out, sup, [ce[doc_of == i].sum() for i in range(len(docs))], doc_of


@pytest.mark.parametrize("changed", [0, 1, 2])
def test_changing_one_document_changes_nothing_of_the_others(target, changed):
    drafter = _drafter(target)
    ids, pos, valid, spans = _row(DOCS, 128)
    anchors = sample_anchors(valid, valid, 24, torch.Generator().manual_seed(0), pos)
    base_out, sup, base_loss, doc_of = _per_doc_losses(target, drafter, DOCS, anchors)
    # blocks stay inside their document: no supervised position past its end
    for j, a in enumerate(anchors[0][0].tolist()):
        lo, hi = spans[int(doc_of[j])]
        last = int(sup[0, j].nonzero().max()) if sup[0, j].any() else -1
        assert a + 1 + last < hi
    assert len(set(doc_of.tolist())) == 3  # every document got anchor slots
    other = [list(d) for d in DOCS]
    other[changed] = [t + 7 for t in other[changed]]
    out, _, loss, _ = _per_doc_losses(target, drafter, other, anchors)
    keep = doc_of != changed
    torch.testing.assert_close(out[0, keep], base_out[0, keep], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[0, ~keep], base_out[0, ~keep], atol=1e-4)
    for i in range(3):
        if i == changed:
            continue
        torch.testing.assert_close(loss[i], base_loss[i], rtol=1e-5, atol=1e-5)
        g0 = torch.autograd.grad(base_loss[i], list(drafter.parameters()), retain_graph=True)
        g1 = torch.autograd.grad(loss[i], list(drafter.parameters()), retain_graph=True)
        for a, b in zip(g0, g1):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_rope_restarts_per_document_in_the_drafter(target):
    """A document packed after another gives the drafter the same outputs as alone."""
    drafter = _drafter(target).eval()
    ids, pos, valid, spans = _row(DOCS, 128)
    ctx = target.context(ids, None, pos)
    lo, hi = spans[2]
    anchors = torch.tensor([[lo + 5, lo + 20]])
    ok = torch.ones(1, 2, dtype=torch.bool)
    emb = block_embeddings(target.embed_tokens, ids, anchors, 16, drafter.spec.mask_token_id)
    packed = drafter(ctx, valid, anchors, ok, emb, pos)
    alone_ids = torch.tensor([DOCS[2]])
    alone = drafter(target.context(alone_ids), torch.ones_like(alone_ids, dtype=torch.bool),
                    anchors - lo, ok, emb)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", ["batch", "plan"])
def test_packed_training_equals_unpacked_training_step_by_step(target, norm):
    """With every candidate anchored, a packed row and its documents one per row train on
    the same blocks: losses and weights agree after each of three optimizer steps, under
    either loss normaliser (the same plan weight on both sides)."""
    import copy
    from dflash.model.loss import Objective, drafter_loss
    d_packed = _drafter(target)
    d_rows = copy.deepcopy(d_packed)
    opts = [torch.optim.AdamW(d.parameters(), lr=1e-3) for d in (d_packed, d_rows)]
    ids, pos, valid, _ = _row(DOCS, 128)
    width = max(map(len, DOCS))
    rows = torch.zeros(len(DOCS), width, dtype=torch.long)
    rvalid = torch.zeros(len(DOCS), width, dtype=torch.bool)
    for i, doc in enumerate(DOCS):
        rows[i, :len(doc)], rvalid[i, :len(doc)] = torch.tensor(doc), True
    emb, head = target.embed_tokens, target.lm_head_weight
    for step in range(3):
        a = drafter_loss(d_packed, target.context(ids, None, pos), emb, head, ids, valid, valid,
                         Objective(128, anchors_per_document=64, norm=norm, batch_weight=300.0),
                         position_ids=pos)
        b = drafter_loss(d_rows, target.context(rows, rvalid.long()), emb, head, rows, rvalid,
                         rvalid, Objective(64, norm=norm, batch_weight=300.0))
        assert int(a.rows) == int(b.rows)
        torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-6)
        for opt, out in zip(opts, (a, b)):
            opt.zero_grad()
            out.loss.backward()
            opt.step()
    for p, q in zip(d_packed.parameters(), d_rows.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("window,causal", [(12, True), (12, False), (None, True)])
def test_a_packed_document_equals_it_alone_under_sliding_and_causal_layers(target, window, causal):
    """[sliding, full] and causal layouts: a document packed after others gives the same
    blocks as in a row of its own (the window counts positions inside the document)."""
    torch.manual_seed(0)
    kinds = ["sliding_attention", "full_attention"] if window else None
    drafter = DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig(
        num_layers=2, layer_types=kinds, sliding_window=window, causal=causal)))).eval()
    ids, pos, valid, spans = _row(DOCS, 128)
    ctx = target.context(ids, None, pos)
    lo, hi = spans[2]
    anchors = torch.tensor([[lo + 5, lo + 20, lo + 40]])
    ok = torch.ones(1, 3, dtype=torch.bool)
    emb = block_embeddings(target.embed_tokens, ids, anchors, 16, drafter.spec.mask_token_id)
    alone_ids = torch.tensor([DOCS[2]])
    alone_ctx = target.context(alone_ids)
    valid1 = torch.ones_like(alone_ids, dtype=torch.bool)
    for backend in ("sdpa", "chunked"):
        drafter.set_attention(backend)
        packed = drafter(ctx, valid, anchors, ok, emb, pos)
        alone = drafter(alone_ctx, valid1, anchors - lo, ok, emb)
        torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
