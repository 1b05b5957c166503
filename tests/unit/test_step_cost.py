"""The step cost model: it recovers a known cost function, predicts a plan's time as the
sum of its batches' costs, flags extrapolation and refuses a file measured elsewhere."""
import json

import numpy as np
import pytest

from dflash.batching.bucket_fit.optimal import build_cost_table, optimal_fits, simulate_seconds
from dflash.batching.step_cost import (TERMS, CostModel, fit_cost_model, fit_with_holdout,
                                       load_cost_file, predict_steps, write_cost_file)
from dflash.batching.strategies import PackingSpec, Planner
from dflash.errors import DataError

TRUE = np.array([2e-3, 1e-4, 3e-7, 2e-10, 5e-6, 1e-9])  # step, row, token, attn, anchor, ctx


def _points(rng, n=60, noise=0.0):
    rows = rng.integers(1, 65, n)
    lens = rng.integers(16, 4097, n)
    anchors = rng.choice([64, 128, 256, 512], n)
    secs = CostModel(TRUE).seconds(rows, lens, anchors) * (1 + noise * rng.standard_normal(n))
    return [{"rows": int(r), "seq_len": int(L), "anchors": int(a), "seconds": float(s)}
            for r, L, a, s in zip(rows, lens, anchors, secs)]


def test_the_fit_recovers_a_known_cost_function():
    pts = _points(np.random.default_rng(0))
    cols = [np.array([p[k] for p in pts]) for k in ("rows", "seq_len", "anchors", "seconds")]
    m = fit_cost_model(*cols)
    np.testing.assert_allclose(m.coef, TRUE, rtol=1e-4)
    # with 3% timing noise the held-out error stays near the noise
    model, fit = fit_with_holdout(_points(np.random.default_rng(1), noise=0.03))
    assert fit["heldout_mean_abs_error"] < 0.05 and fit["num_heldout"] > 10
    assert (model.coef >= 0).all()


def test_a_plan_is_predicted_as_the_sum_of_its_batches_and_extrapolation_is_flagged():
    m = CostModel(TRUE, {"rows": 16, "seq_len": 1024, "anchors": 512, "tokens": 8192})
    rows, lens = np.array([16, 8, 2, 32]), np.array([256, 1024, 900, 256])
    pred = predict_steps(m, rows, lens, 512)
    each = [TRUE @ [1, r, r * L, r * L * L, r * 512, r * 512 * L] for r, L in zip(rows, lens)]
    assert pred["total_seconds"] == pytest.approx(sum(each), rel=1e-12)
    assert pred["extrapolated_steps"] == 1  # 32 rows: beyond the profiled 16


def test_a_cost_file_from_elsewhere_names_the_differing_field(tmp_path):
    ident = {"device": "NVIDIA H100", "device_count": 8, "target_dtype": "bfloat16",
             "autocast": "bf16", "target_hidden_size": 4096, "target_num_layers": 36,
             "vocab_size": 151936, "drafter_num_layers": 1, "block_size": 16,
             "compile": "dynamic", "step_kind": "padded"}
    path = write_cost_file(tmp_path / "c.json", ident, CostModel(TRUE), [], {})
    load_cost_file(path, dict(ident))
    for field, value in [("device", "NVIDIA H200"), ("target_hidden_size", 2048),
                         ("block_size", 8), ("step_kind", "packed"), ("target_tp", 4)]:
        with pytest.raises(DataError, match=rf"{field} is .* there but .* in this run"):
            load_cost_file(path, {**ident, field: value})
    # written before target_tp existed: measured without tensor parallelism
    load_cost_file(path, {**ident, "target_tp": 1})
    from dflash.config import compose
    from dflash.warmup.profile import model_identity
    assert model_identity(compose("train", ["topology.target_tp=2"]))["target_tp"] == 2
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(DataError, match="bad.json is corrupt"):
        load_cost_file(tmp_path / "bad.json")
    with pytest.raises(DataError, match="not found"):
        load_cost_file(tmp_path / "none.json")
    for text, named in [("[1, 2]", "no 'identity' object"), ('{"identity": {}}', "no 'model'"),
                        ('{"identity": {}, "model": {"terms": %s}}' % json.dumps(list(TERMS)),
                         "no usable 'coef'")]:
        (tmp_path / "part.json").write_text(text)
        with pytest.raises(DataError, match=named):
            load_cost_file(tmp_path / "part.json")
    doc = json.loads(path.read_text())
    doc["model"]["terms"] = ["step", "row"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match="terms"):
        load_cost_file(tmp_path / "old.json")


def test_time_fitted_buckets_are_never_slower_than_padding_fitted_ones():
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(6.5, 0.8, 20000), 16, 8000).astype(np.int64)
    spec = PackingSpec(token_budget=16384, max_batch_size=32)
    # a step with a large fixed overhead: fewer, fuller batches pay off more than padding
    model = CostModel(np.array([5e-2, 1e-4, 1e-7, 1e-10, 0.0, 0.0]))
    pad = optimal_fits(build_cost_table(lengths, spec, 64), 4)[-1]
    timed = optimal_fits(build_cost_table(lengths, spec, 64, time_model=model, anchors=1), 4)[-1]
    s_pad = simulate_seconds(lengths, pad.boundaries, spec, model, 1)
    s_time = simulate_seconds(lengths, timed.boundaries, spec, model, 1)
    assert s_time["seconds_per_epoch"] <= s_pad["seconds_per_epoch"] * 1.01
    # and the exact simulation prices every batch of the real planner
    plan = Planner("bucketed", lengths, timed.boundaries, spec, seed=0).epoch(0)
    assert s_time["seconds_per_epoch"] == pytest.approx(
        float(model.seconds(plan.batch_sizes, plan.seq_len, 1).sum()), rel=1e-12)


def test_a_shape_budget_no_fit_can_meet_is_refused_naming_it(tmp_path):
    from dflash.buckets import run_buckets
    from dflash.config import compose
    rng = np.random.default_rng(0)
    np.save(tmp_path / "lengths.npy", rng.integers(16, 4000, 3000).astype(np.int64))
    cost = write_cost_file(tmp_path / "c.json", {}, CostModel(TRUE, {"anchors": 64}), [], {})
    cfg = compose("bucket_fit", [f"lengths_file={tmp_path / 'lengths.npy'}", "num_buckets=auto",
                                 "auto_max=3", f"cost={cost}", "max_shapes=1", "refine=false",
                                 "candidates=64"])
    with pytest.raises(DataError, match=r"max_shapes=1: even one bucket runs at \d+ distinct shapes"):
        run_buckets(cfg)


def test_profiled_shapes_follow_the_settings_and_packed_rows_vary_every_dimension():
    from dflash.warmup.profile import profile_shapes
    from dflash.warmup.shapes import Shape
    warm = [Shape(min(16, 4096 // L), L, 32) for L in range(24, 1025, 8)]  # padded: many lengths
    for max_shapes, grid in [(6, 2), (24, 6)]:
        shapes = profile_shapes(warm, 4096, 16, max_shapes, grid)
        base = max_shapes + 3 + 2 * grid  # warm picks, the largest three, the envelope
        assert len(shapes) <= base + -(-base // 3)  # plus half-anchor variants of a third
        assert max(s.seq_len for s in shapes) == 1024 and min(s.seq_len for s in shapes) == 24
    packed = profile_shapes([Shape(2, 1024, 400)], 4096, 16)  # one length: vary each dimension
    assert {s.seq_len for s in packed} >= {512, 1024} and {s.batch_size for s in packed} >= {1, 2}
    assert {s.anchors for s in packed} >= {100, 400}


def test_a_profile_reports_how_well_the_machine_repeats_and_warns_above_ten_percent():
    from dflash.batching.step_cost import repeat_spread
    from dflash.profile import steadiness_warning
    pts = [{"rows": 1, "seq_len": 8, "anchors": 1, "seconds": s, "spread": d}
           for s, d in [(1.0, 0.02), (2.0, 0.5), (4.0, 0.2)]]  # 2%, 25%, 5%
    assert repeat_spread(pts) == pytest.approx(0.05)
    assert steadiness_warning({"repeat_spread": 0.05}) is None
    assert steadiness_warning({}) is None  # one repeat: nothing to say
    pts[0]["spread"] = 0.3  # now 30%, 25%, 5%: the median shape moved 25%
    line = steadiness_warning({"repeat_spread": repeat_spread(pts)})
    assert "25%" in line and "OMP_NUM_THREADS=1" in line and "\n" not in line
