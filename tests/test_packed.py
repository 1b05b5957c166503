"""batching=packed: the plan (every sample once, one shape, nearly full rows) and the
leakage tests: no document in a packed row changes anything of another one, for the
target context, the drafter's outputs, its loss and its gradients."""
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dflash.batching import DataError, PackingSpec
from dflash.batching.strategies import Planner
from dflash.config import DrafterConfig, TargetConfig
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.loss import block_embeddings, block_targets, sample_anchors
from dflash.model.target import Target

SPEC = PackingSpec(token_budget=4096, max_batch_size=64, row_len=1024, pack_window=16)


def _lengths(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(4.8, 0.8, n), 24, 1024).astype(np.int64)


def test_packed_plan_takes_every_sample_once_in_one_shape():
    lengths = _lengths()
    planner = Planner("packed", lengths, [0, 2000], SPEC, seed=3)
    plans = [planner.epoch(e) for e in range(2)]
    for plan in plans:
        assert np.array_equal(np.sort(plan.indices), np.arange(len(lengths)))
        assert (plan.batch_rows == 4).all() and (plan.seq_len == 1024).all()
        for step in range(plan.num_batches):
            b = plan[step]
            fill = np.bincount(b.row_of, weights=lengths[b.sample_ids], minlength=4)
            assert fill.max() <= 1024 and b.shape == (4, 1024)
            assert b.num_tokens == int(lengths[b.sample_ids].sum())
        assert plan.padding_efficiency > 0.97
        assert plan.padded_tokens == plan.num_batches * 4 * 1024
    # deterministic for (seed, epoch), different across epochs (random order)
    again = Planner("packed", lengths, [0, 2000], SPEC, seed=3).epoch(1)
    assert np.array_equal(again.indices, plans[1].indices)
    assert np.array_equal(again.row_of, plans[1].row_of)
    assert not np.array_equal(plans[0].indices, plans[1].indices)
    # resume is a slice: batch k of the plan is batch k of the resumed iteration
    assert np.array_equal(next(plans[1].batches(7)).sample_ids, plans[1][7].sample_ids)
    with pytest.raises(DataError, match=r"row_len=1024 is shorter than a sample of 1500"):
        Planner("packed", np.array([100, 1500]), [0, 2000], SPEC).epoch(0)


def test_packed_batches_keep_the_batch_size_cap_on_average():
    """On a cap-bound profile (short samples, a large budget) a packed batch carries no
    more documents than the cap lets every other strategy's batch carry."""
    lengths = np.random.default_rng(0).integers(60, 190, size=4000)  # mean ~125
    spec = PackingSpec(token_budget=4096, max_batch_size=16, row_len=1024, pack_window=16)
    planner = Planner("packed", lengths, [0, 2000], spec, seed=0)
    assert planner.rows_per_batch == 2  # 16 x ~125 tokens: 2 rows, not the budget's 4
    plan = planner.epoch(0)
    assert abs(plan.batch_sizes.mean() - 16) < 1.0 and (plan.batch_rows == 2).all()
    unpacked = Planner("random", lengths, [0, 2000], spec, seed=0).epoch(0)
    assert abs(plan.useful_tokens / plan.num_batches
               - unpacked.useful_tokens / unpacked.num_batches) < 0.1 * 2048


def test_packed_layout_positions_restart_per_document(tmp_path):
    from dflash.data.format import DatasetWriter
    w = DatasetWriter(tmp_path / "ds", 100, {})
    docs = [np.arange(1, 6), np.arange(10, 13), np.arange(20, 27)]
    for d in docs:
        w.add(d, np.ones(len(d), dtype=np.uint8))
    ds = w.close()
    ids, mask, valid, pos = ds.collate_packed([0, 1, 2], [0, 0, 1], 3, 10)
    assert ids[0].tolist() == [1, 2, 3, 4, 5, 10, 11, 12, 0, 0]
    assert pos[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1]
    assert pos[1].tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2] and valid[1].sum() == 7
    assert not valid[2].any() and not mask[2].any()  # an empty filler row


@pytest.fixture(scope="module")
def target():
    return Target.from_config(OmegaConf.structured(TargetConfig(dtype="float32")))


def _row(docs, row_len):
    """One packed row of the given documents (lists of ids) and its position ids."""
    ids = torch.zeros(1, row_len, dtype=torch.long)
    pos = torch.arange(row_len)[None].clone()
    valid = torch.zeros(1, row_len, dtype=torch.bool)
    at, spans = 0, []
    for d in docs:
        ids[0, at:at + len(d)] = torch.tensor(d)
        pos[0, at:at + len(d)] = torch.arange(len(d))
        valid[0, at:at + len(d)] = True
        spans.append((at, at + len(d)))
        at += len(d)
    pos[0, at:] = torch.arange(row_len - at)
    return ids, pos, valid, spans


DOCS = [list(range(3, 40)), list(range(100, 121)), list(range(200, 250))]


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


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_packed_plan_invariants(data):
    row_len = data.draw(st.integers(8, 600))
    rows = data.draw(st.integers(1, 6))
    lengths = np.array(data.draw(st.lists(st.integers(1, row_len), min_size=1, max_size=300)))
    spec = PackingSpec(row_len * rows, 64, row_len=row_len,
                       pack_window=data.draw(st.integers(1, 40)))
    seed, epoch = data.draw(st.integers(0, 2**31)), data.draw(st.integers(0, 100))
    planner = Planner("packed", lengths, [0, 10], spec, seed=seed)
    # the budget's rows, unless the cap of 64 documents a batch (on average) binds first
    assert planner.rows_per_batch == max(1, min(rows, round(64 * lengths.mean() / row_len)))
    rows = planner.rows_per_batch
    plan = planner.epoch(epoch)
    assert np.array_equal(np.sort(plan.indices), np.arange(len(lengths)))
    assert (plan.batch_rows == rows).all() and (plan.seq_len == row_len).all()
    batch_of = np.repeat(np.arange(plan.num_batches), plan.batch_sizes)
    fill = np.bincount(batch_of * rows + plan.row_of, weights=lengths[plan.indices])
    assert fill.max() <= row_len and (0 <= plan.row_of).all() and (plan.row_of < rows).all()
    assert plan.useful_tokens == int(lengths.sum())
    assert plan.padded_tokens == plan.num_batches * rows * row_len
    again = Planner("packed", lengths, [0, 10], spec, seed=seed).epoch(epoch)
    assert np.array_equal(again.indices, plan.indices)
    assert np.array_equal(again.row_of, plan.row_of)
    # a shard is a plan of whole batches: rows stay with their samples
    half = plan.take(np.arange(plan.num_batches)[::2])
    for k in range(half.num_batches):
        b, ref = half[k], plan[2 * k]
        assert np.array_equal(b.sample_ids, ref.sample_ids)
        assert np.array_equal(b.row_of, ref.row_of) and b.shape == ref.shape


def test_packed_rows_get_the_anchor_slots_their_documents_would_get_alone():
    from dflash.batching.packed_rows import anchor_slots_per_row
    lengths = np.full(1000, 128)
    # 8 documents of 128 a row, 32 slots each when unpacked
    assert anchor_slots_per_row(lengths, 32, 1024) == 256
    # documents shorter than num_anchors bring only their own positions
    assert anchor_slots_per_row(np.full(10, 16), 32, 1024) == 1024
    assert anchor_slots_per_row(lengths, 32, 1024, configured=100) == 100
    mixed = np.array([100, 300] * 50)  # mean 200: 5.12 documents a row, min(L, 64) = 64
    assert anchor_slots_per_row(mixed, 64, 1024) == 328  # ceil(64 * 5.12) -> multiple of 8


def test_each_packed_document_gets_at_most_the_slots_it_would_get_alone():
    # documents with 6, 51 and 201 supervised positions (5, 50, 200 anchor candidates)
    _, pos, valid, spans = _row([list(range(6)), list(range(51)), list(range(201))], 300)
    counts = []
    for seed in range(5):
        anchors, ok = sample_anchors(valid, valid, 128, torch.Generator().manual_seed(seed),
                                     pos, per_document=32)
        a = anchors[0][ok[0]]
        counts.append([int(((a >= lo) & (a < hi)).sum()) for lo, hi in spans])
        assert (a[1:] > a[:-1]).all()  # sorted, distinct
    assert counts == [[5, 32, 32]] * 5
    # without the cap the row's slots follow the candidates: the long document dominates
    anchors, ok = sample_anchors(valid, valid, 128, torch.Generator().manual_seed(0), pos)
    a = anchors[0][ok[0]]
    assert int(((a >= spans[2][0]) & (a < spans[2][1])).sum()) > 64


def test_packed_training_equals_unpacked_training_step_by_step(target):
    """With every candidate anchored, a packed row and its documents one per row train on
    the same blocks: losses and weights agree after each of three optimizer steps."""
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
                         Objective(128, anchors_per_document=64), position_ids=pos)
        b = drafter_loss(d_rows, target.context(rows, rvalid.long()), emb, head, rows, rvalid,
                         rvalid, Objective(64))
        assert int(a.rows) == int(b.rows)
        torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-6)
        for opt, out in zip(opts, (a, b)):
            opt.zero_grad()
            out.loss.backward()
            opt.step()
    for p, q in zip(d_packed.parameters(), d_rows.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
