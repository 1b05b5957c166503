"""model.target.cache_mb: each sample's target context kept across epochs. The kept rows
are the sample's own forward, laid out as collate lays out padded and packed batches;
training with the cache equals training without it."""
import numpy as np
import pytest
import torch

from dflash.batching.epoch_plan import Batch
from dflash.data.format import DatasetWriter
from dflash.model.feature_cache import FeatureCache
from dflash.model.loss import Objective
from dflash.step import DeviceBatch, TrainStep
from tests.helpers.models import tiny_drafter, tiny_target


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    g = np.random.default_rng(0)
    w = DatasetWriter(tmp_path_factory.mktemp("d") / "d", vocab_size=500)
    for n in (30, 22, 17, 40, 25, 12):
        w.add(g.integers(3, 500, n), np.arange(n) >= 6)
    return w.close()


def _batch(ds, sample_ids, row_of=None, rows=0, seq_len=48, epoch=0):
    b = Batch(epoch, 0, np.asarray(sample_ids, dtype=np.int64), 0, seq_len, 0,
              None if row_of is None else np.asarray(row_of), rows)
    arrays = ds.collate_batch(b, b.num_rows, seq_len)
    t = [torch.as_tensor(a) for a in arrays]
    return DeviceBatch(b, *t[:3], position_ids=t[3] if len(t) > 3 else None)


@pytest.mark.parametrize("packed", [False, True])
def test_rows_are_each_samples_own_forward_in_the_batch_layout(dataset, packed):
    target = tiny_target()
    calls = []

    def forward(ids):
        calls.append(ids.shape[1])
        return target.context(ids)

    cache = FeatureCache(dataset.lengths, 64)
    b = (_batch(dataset, [0, 2, 1, 5], row_of=[0, 0, 1, 1], rows=2) if packed
         else _batch(dataset, [0, 2, 1]))
    got = cache.context(forward, b.ids, b.batch)
    assert sorted(calls) == sorted(int(dataset.lengths[i]) for i in b.batch.sample_ids)
    for sid, r, lo, n in cache.spans(b.batch):
        tokens, _ = dataset.sample(sid)
        assert b.ids[r, lo:lo + n].tolist() == tokens.tolist()  # collate's layout
        alone = target.context(torch.tensor(np.array(tokens), dtype=torch.int64)[None])[0]
        torch.testing.assert_close(got[r, lo:lo + n], alone)
    assert not got[~b.valid].any()  # nothing but zeros where no sample is
    # a later epoch's batch of the same samples: no forward at all
    calls.clear()
    again = cache.context(forward, b.ids, b.batch)
    assert calls == [] and torch.equal(again, got) and cache.hits == len(b.batch.sample_ids)


def test_past_the_limit_samples_are_recomputed(dataset):
    target = tiny_target()
    one = int(dataset.lengths[0]) * target.context(torch.zeros(1, 1, dtype=torch.long)).shape[-1] * 4
    cache = FeatureCache(dataset.lengths, one / 2**20)  # room for sample 0 only
    b = _batch(dataset, [0, 1])
    first = cache.context(target.context, b.ids, b.batch)
    assert set(cache.rows) == {0} and cache.full and cache.bytes == one
    assert torch.equal(cache.context(target.context, b.ids, b.batch), first)
    assert cache.misses == 3 and cache.hits == 1


def test_a_negative_limit_is_refused_naming_the_key(dataset):
    from dflash.errors import ConfigError
    with pytest.raises(ConfigError, match="model.target.cache_mb=-1"):
        FeatureCache(dataset.lengths, -1)


def test_training_with_the_cache_equals_training_without(dataset):
    target = tiny_target()
    runs = []
    for cached in (False, True):
        drafter = tiny_drafter(target)
        opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        step = TrainStep(target, drafter, opt, sched, Objective(4, norm="batch"),
                         feature_cache=FeatureCache(dataset.lengths, 64) if cached else None)
        losses = []
        for epoch, order in enumerate(([0, 1, 2], [3, 4, 5], [2, 0, 4], [5, 1, 3])):
            losses.append(float(step(_batch(dataset, order, epoch=epoch))["loss"]))
        runs.append((losses, [p.detach().clone() for p in drafter.parameters()]))
        if cached:
            assert step.feature_cache.hits == 6 and step.feature_cache.misses == 6
    (plain, w_plain), (kept, w_kept) = runs
    np.testing.assert_allclose(kept, plain, rtol=1e-5)
    for a, b in zip(w_kept, w_plain):  # (Adam magnifies rounding where a gradient is ~0)
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
