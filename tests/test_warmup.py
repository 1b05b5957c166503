"""The closed shape set, the warm run and the compile monitor."""
import json

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

import dflash.config  # noqa: F401
from conftest import REPO, WORLD, run_module
from dflash.batching.epoch_plan import EpochPlan
from dflash.errors import DataError
from dflash.warmup.shapes import PlanShapes, Rounding, ShapePlan, select


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
    with pytest.raises(DataError, match="increasing positive"):
        Rounding(8, (4, 2))
    with pytest.raises(DataError, match="pad_to_multiple"):
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
    with pytest.raises(DataError, match="warmup.policy must be one of"):
        select("observed", shapes)


def test_padding_rows_carry_nothing(world_cache):
    from dflash.trainer import Trainer
    from dflash.warmup.shapes import Shape
    from tests.helpers.batches import collate
    with initialize_config_dir(config_dir=str(REPO / "dflash" / "conf"), version_base="1.3"):
        cfg = compose("train", [*WORLD, f"data.cache_dir={world_cache}", "logger.progress=false"])
    r = Trainer(cfg, "/tmp/unused").build()
    batch = r.shard(0)[0]
    shape = Shape(batch.batch_size + 3, batch.seq_len + 5, 32)
    b = collate(r.dataset, batch, torch.device("cpu"), shape)
    assert tuple(b.ids.shape) == (shape.batch_size, shape.seq_len)
    assert not b.valid[batch.batch_size:].any() and not b.loss_mask[batch.batch_size:].any()
    natural = collate(r.dataset, batch, torch.device("cpu"))
    assert torch.equal(b.ids[:batch.batch_size, :batch.seq_len], natural.ids)
    ctx = r.train_step.context(b)
    assert torch.isfinite(ctx).all()  # an all-padding row keeps the target's softmax defined
    # the real rows' context does not depend on the padding around them
    torch.testing.assert_close(ctx[:batch.batch_size, :batch.seq_len], r.train_step.context(natural))


def _params(runner):
    return {k: v.detach().clone() for k, v in runner.drafter.state_dict().items()}


def test_warmup_does_not_change_training(tmp_path, world_cache):
    from dflash.trainer import Trainer
    from dflash.loggers import Logger
    outs = []
    for policy in ("all", "none"):
        with initialize_config_dir(config_dir=str(REPO / "dflash" / "conf"), version_base="1.3"):
            cfg = compose("train", [*WORLD, f"data.cache_dir={world_cache}", "logger.progress=false",
                                    f"warmup={policy}", "epochs=1", "optim.max_steps=6"])
        r = Trainer(cfg, tmp_path / policy).build()
        summary = r.train(Logger())
        outs.append((summary, _params(r)))
    (warm, pw), (cold, pc) = outs
    assert len(warm["warmup"]["per_shape"]) == warm["warmup"]["num_warm_shapes"] > 0
    assert warm["warmup_shapes"] and cold["warmup_shapes"] == []
    assert all(torch.equal(pw[k], pc[k]) for k in pw)


# Two shapes (lengths up to 512, rows to 16) keep inductor's CPU compiles to ~1 minute
COMPILED = [*WORLD, "eval.enabled=false", "epochs=1", "logger.progress=false",
            "model.compile=static", "warmup.pad_to_multiple=256", "warmup.batch_sizes=[16]"]


def test_static_compile_after_warmup_compiles_nothing(tmp_path, world_cache):
    runs = {}
    for policy in ("all", "none"):  # `none` second: it reads the compile cache `all` filled
        run = tmp_path / policy
        run_module("dflash.train", *COMPILED, f"warmup={policy}", f"data.cache_dir={world_cache}",
                   f"hydra.run.dir={run}")
        runs[policy] = json.loads((run / "summary.json").read_text())
    warm, cold = runs["all"], runs["none"]
    shapes = {tuple(s) for s in warm["warmup_shapes"]}
    assert len(shapes) >= 2 and warm["compiles_after_warmup"] == 0 and warm["compile_events"] == []
    assert warm["warmup"]["steps_covered"] == 1.0
    # without warmup every shape compiles mid-training, and the monitor names each one
    assert cold["compiles_after_warmup"] > 0
    named = {tuple(e["shape"]) for e in cold["compile_events"]}
    assert named == shapes
    assert all(e["dynamo_graphs"] >= 1 and e["step"] >= 1 for e in cold["compile_events"])


def test_on_compile_stop_names_the_shape(tmp_path, world_cache):
    proc = run_module("dflash.train", *COMPILED, "warmup=none", "warmup.on_compile=stop",
                      f"data.cache_dir={world_cache}", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode != 0
    assert "warmup.on_compile=stop" in proc.stderr and "shape [batch 16, length" in proc.stderr


def test_compile_refuses_the_eager_only_chunked_attention(tmp_path, world_cache):
    """The chunked mask's key windows are data-dependent: compiled, every batch would
    recompile. Asking for both fails at start; `auto` under compile takes the dense mask."""
    proc = run_module("dflash.train", *COMPILED, "model.attention=chunked", "warmup=none",
                      f"data.cache_dir={world_cache}", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode != 0
    assert "model.attention=chunked" in proc.stderr and "eager only" in proc.stderr
