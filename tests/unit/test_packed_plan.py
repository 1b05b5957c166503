"""batching=packed: the plan (every sample once, one shape, nearly full rows) and the
leakage tests: no document in a packed row changes anything of another one, for the
target context, the drafter's outputs, its loss and its gradients."""
import numpy as np
import pytest
import torch

from dflash.batching import DataError, PackingSpec
from dflash.batching.strategies import Planner
from dflash.model.loss import sample_anchors

SPEC = PackingSpec(token_budget=4096, max_batch_size=64, row_len=1024, pack_window=16)


DOCS = [list(range(3, 40)), list(range(100, 121)), list(range(200, 250))]

from hypothesis import given, settings, strategies as st  # noqa: E402
from tests.helpers.models import packed_row as _row

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
