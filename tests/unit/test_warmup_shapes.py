"""The closed shape set, the warm run and the compile monitor."""

import numpy as np
import pytest

from tests.helpers.run import WORLD
from dflash.batching.epoch_plan import EpochPlan
from dflash.errors import DataError
from dflash.warmup.shapes import PlanShapes, Rounding, ShapePlan, select
from dflash.errors import ConfigError


COMPILED = [*WORLD, "eval.enabled=false", "epochs=1", "logger.progress=false",
            "model.compile=static", "warmup.pad_to_multiple=256", "warmup.batch_sizes=[16]"]

def _plan(batches, bucket):
    """An EpochPlan from explicit batches of lengths, with the given bucket per batch."""
    lengths = np.concatenate([np.asarray(b) for b in batches]).astype(np.int64)
    offsets = np.r_[0, np.cumsum([len(b) for b in batches])].astype(np.int64)
    return EpochPlan.build(0, np.arange(len(lengths)), offsets, np.asarray(bucket), lengths), lengths


def test_shapes_follow_each_batch_not_the_bucket_list():
    # batches in bucket order 2, 0, 1, 0, 2: unlike the order of the bucket list
    plan, _ = _plan([[300, 290], [20, 30, 25, 17], [100, 120, 90], [40], [250, 260, 270]],
                    [2, 0, 1, 0, 2])
    shapes = PlanShapes.from_plans([plan], Rounding(pad_to_multiple=16, anchors=8))
    assert shapes.bucket.tolist() == [2, 0, 1, 0, 2]
    assert list(zip(shapes.rounded_b.tolist(), shapes.rounded_s.tolist())) == [
        (2, 304), (4, 32), (3, 128), (1, 48), (3, 272)]
    # bucket_max: one envelope per bucket, each holding exactly that bucket's batches
    assert select("bucket_max", shapes) == [(3, 128), (3, 304), (4, 48)]
    sp = ShapePlan(shapes, select("bucket_max", shapes), Rounding(16, (), 8), "bucket_max")
    assert [sp.for_batch(plan[i]).as_list() for i in range(5)] == [
        [3, 304, 8], [4, 48, 8], [3, 128, 8], [4, 48, 8], [3, 304, 8]]
    assert sp.warm[0].tokens == max(w.tokens for w in sp.warm)  # largest first


def test_parallel_lists_must_agree():
    r = Rounding(8)
    with pytest.raises(DataError, match="disagree on the batch count"):
        # sample-level bucket ids (5) beside batch-level shapes (2): the seeds' bug
        PlanShapes.from_arrays([0, 0], [0, 0, 1, 1, 1], [2, 3], [10, 20], rounding=r)
    with pytest.raises(DataError, match="no samples or zero length"):
        PlanShapes.from_arrays([0], [0], [0], [10], rounding=r)


def test_rounding_and_menu():
    r = Rounding(pad_to_multiple=64, batch_sizes=(1, 4, 16), anchors=32)
    b, s = r.arrays(np.array([1, 2, 5, 16]), np.array([1, 64, 65, 200]))
    assert b.tolist() == [1, 4, 16, 16] and s.tolist() == [64, 64, 128, 256]
    with pytest.raises(DataError, match="more than the largest warmup.batch_sizes"):
        r.arrays(np.array([17]), np.array([10]))
    with pytest.raises(ConfigError, match="increasing positive"):
        Rounding(8, (4, 2))
    with pytest.raises(ConfigError, match="pad_to_multiple"):
        Rounding(0)


def test_policies_on_a_real_plan(full_lengths):
    from dflash.batching.boundaries import resolve_boundaries
    from dflash.batching.strategies import build_planner
    from omegaconf import OmegaConf
    lengths = full_lengths[:60000]
    bcfg = OmegaConf.create({"name": "q", "kind": "quantile", "boundaries": None, "num_buckets": 6})
    batching = OmegaConf.create({"strategy": "bucketed", "token_budget": 49152, "max_batch_size": 64,
                                 "sort_window": 0, "remainder": "repeat", "balance_steps": False,
                                 "attention_cost": 0.0})
    planner = build_planner(batching, lengths, resolve_boundaries(bcfg, lengths), 0)
    shapes = PlanShapes.from_plans([planner.epoch(0), planner.epoch(1)], Rounding(64, (), 512))
    counts = shapes.rounded_counts()
    total = len(shapes.rounded_b)
    assert select("none", shapes) == []
    assert select("all", shapes) == sorted(counts)
    top = select("top_k", shapes, top_k=3, envelope=False)
    assert sorted(top) == sorted(sorted(counts, key=lambda k: -counts[k])[:3])
    cov = select("coverage", shapes, coverage=0.9, envelope=False)
    sp = ShapePlan(shapes, cov, Rounding(64, (), 512), "coverage")
    rep = sp.report()
    assert rep["steps_covered"] >= 0.9 and len(cov) < len(counts)
    # the smallest such set (greedy by frequency): one shape fewer falls short
    smaller = ShapePlan(shapes, cov[:-1] if len(cov) > 1 else [], Rounding(64, (), 512), "x")
    assert smaller.report()["steps_covered"] < 0.9 or len(cov) == 1
    # with envelopes every batch runs at a warmed shape
    full = ShapePlan(shapes, select("coverage", shapes, coverage=0.9), Rounding(64, (), 512), "c")
    assert full.report()["steps_covered"] == 1.0
    e0 = rep["epochs"][0]
    assert e0["distinct_natural"] > e0["distinct_rounded"] >= e0["distinct_run"]
    assert e0["run_padded_tokens"] >= e0["natural_padded_tokens"] and total == sum(
        e["steps"] for e in rep["epochs"])
    with pytest.raises(ConfigError, match="warmup.policy must be one of"):
        select("observed", shapes)


def test_auto_warms_every_shape_only_where_something_compiles():
    from omegaconf import OmegaConf
    from dflash.config import WarmupConfig
    from dflash.warmup.shapes import build_shape_plan
    plan, _ = _plan([[300, 290], [20, 30, 25, 17], [100, 120, 90]], [2, 0, 1])
    cfg = OmegaConf.structured(WarmupConfig(policy="auto", pad_to_multiple=16))
    warm = build_shape_plan([plan], cfg, 8, compiles=True)
    cold = build_shape_plan([plan], cfg, 8, compiles=False)
    every = build_shape_plan([plan], OmegaConf.merge(cfg, {"policy": "all"}), 8)
    assert [w.as_list() for w in warm.warm] == [w.as_list() for w in every.warm] != []
    assert warm.policy == "all" and cold.policy == "none" and cold.warm == []
    # both run every batch at the same shape: warming changes when compiles happen, not what runs
    assert [warm.for_batch(plan[i]) for i in range(3)] == [cold.for_batch(plan[i]) for i in range(3)]
