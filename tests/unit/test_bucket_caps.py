"""Per-bucket batch sizes: the planner honours them, bad ones are refused in one line,
and the time fit chooses a lower cap only where the cost model makes it faster."""
import numpy as np
import pytest
import yaml

from dflash.batching.bucket_fit.caps import fit_bucket_caps
from dflash.batching.bucket_fit.cost import bucket_costs_from, histogram_bins, whole_bucket_cost
from dflash.batching.bucket_fit.optimal import simulate_seconds
from dflash.batching.step_cost import CostModel, write_cost_file
from dflash.batching.strategies import PackingSpec, Planner
from dflash.errors import ConfigError

BOUNDS = [0, 200, 800, 4001]


def _lengths(n=6000, seed=0):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(5.8, 0.9, n), 16, 4000).astype(np.int64)


def test_each_buckets_batches_stay_within_its_cap():
    lengths, spec = _lengths(), PackingSpec(token_budget=8192, max_batch_size=32)
    caps = np.array([5, 32, 3])
    plan = Planner("bucketed", lengths, BOUNDS, spec, seed=4, bucket_caps=caps).epoch(2)
    assert np.array_equal(np.sort(plan.indices), np.arange(len(lengths)))  # each once
    assert (plan.batch_sizes <= caps[plan.bucket]).all()  # the rule itself: test_packing
    # the caps bind where the budget alone would take more
    free = Planner("bucketed", lengths, BOUNDS, spec, seed=4).epoch(2)
    assert free.batch_sizes[free.bucket == 0].max() > 5 and plan.num_batches > free.num_batches
    # caps equal to max_batch_size: the very plan without caps
    same = Planner("bucketed", lengths, BOUNDS, spec, seed=4, bucket_caps=[32] * 3).epoch(2)
    assert np.array_equal(same.indices, free.indices)
    assert np.array_equal(same.batch_sizes, free.batch_sizes)


@pytest.mark.parametrize("caps, message", [
    ([4, 4], r"needs one cap per bucket \(3\), got 2 values"),
    ([4, 0, 4], r"\[1\] = 0 is outside \[1, batching.max_batch_size=32\]"),
    ([4, 4, 33], r"\[2\] = 33 is outside"),
    ([4, 2.5, 4], "must be integers"),
])
def test_bad_caps_are_refused_naming_the_key(caps, message):
    with pytest.raises(ConfigError, match=rf"buckets.max_batch_size.*{message}"):
        Planner("bucketed", _lengths(100), BOUNDS, PackingSpec(8192, 32), bucket_caps=caps)


def test_one_bucket_cost_is_the_last_entry_of_the_all_pairs_row():
    _, values, counts, _ = histogram_bins(_lengths(), 64)
    for cap in (3, 17, 64):
        table = bucket_costs_from(0, values, counts, 8192, cap, per_batch=0.25)[-1]
        assert whole_bucket_cost(values, counts, 8192, cap, per_batch=0.25) == pytest.approx(table)


def test_a_lower_cap_is_chosen_only_where_the_model_makes_it_faster():
    lengths, spec = _lengths(), PackingSpec(token_budget=16384, max_batch_size=64)
    wide = [0, 64, 4001]  # the top bucket spans 64..4000: a big batch's max is long
    # attention-heavy rows and no per-step cost: fewer rows a batch pad less, and cost nothing
    attn = CostModel(np.array([0.0, 0.0, 1e-7, 1e-7, 0.0, 0.0]))
    caps, rows = fit_bucket_caps(lengths, wide, spec, attn, anchors=1)
    assert caps[1] < 64 and rows[1]["seconds_per_sample"] < rows[1]["seconds_per_sample_full_cap"]
    faster = simulate_seconds(lengths, wide, spec, attn, 1, 2, bucket_caps=caps)
    slower = simulate_seconds(lengths, wide, spec, attn, 1, 2)
    assert faster["seconds_per_epoch"] < slower["seconds_per_epoch"]
    # a large per-step cost and linear rows: every bucket keeps max_batch_size
    steps = CostModel(np.array([1.0, 1e-4, 1e-7, 0.0, 0.0, 0.0]))
    caps, _ = fit_bucket_caps(lengths, wide, spec, steps, anchors=1)
    assert (caps == 64).all()


def test_the_buckets_app_writes_caps_the_planner_then_uses(tmp_path):
    from dflash.buckets import run_buckets
    from dflash.config import compose
    np.save(tmp_path / "lengths.npy", _lengths(3000))
    cost = write_cost_file(tmp_path / "c.json", {}, CostModel(
        np.array([0.0, 0.0, 1e-7, 1e-7, 0.0, 0.0]), {"anchors": 1}), [], {})
    out = tmp_path / "conf" / "buckets" / "timed.yaml"
    args = [f"lengths_file={tmp_path / 'lengths.npy'}", "num_buckets=2", f"cost={cost}",
            "refine=false", "candidates=64", "batching.token_budget=16384",
            "batching.max_batch_size=64",
            "data.max_seq_len=4096", f"out={out}"]
    result = run_buckets(compose("bucket_fit", args))
    caps = result["time_fit"]["caps"]
    assert caps["adopted"] and result["bucket_caps"] == caps["caps"]
    assert caps["with_caps"]["seconds_per_epoch"] < caps["without_caps"]["seconds_per_epoch"]
    preset = yaml.safe_load(out.read_text())
    assert preset["max_batch_size"] == caps["caps"]
    # the plan app selects the preset and plans with its caps
    from dflash.plan import report_for
    from dflash.data.build import load_data
    cfg = compose("plan", [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "buckets=timed",
                           "batching=bucketed", "batching.token_budget=16384",
                           "batching.max_batch_size=64", f"lengths_file={tmp_path / 'lengths.npy'}",
                           "data.max_seq_len=4096", "epochs=1"])
    report = report_for(cfg, load_data(cfg.data, lengths_file=cfg.lengths_file))
    assert report["bucket_caps"] == caps["caps"]
    assert all(b["mean_batch_size"] <= c for b, c in zip(report["buckets"], caps["caps"]))
    # off: fit_caps=false writes no caps
    plain = run_buckets(compose("bucket_fit", [*args, "fit_caps=false"]))
    assert plain["bucket_caps"] is None and "max_batch_size" not in yaml.safe_load(out.read_text())


def test_caps_are_part_of_the_plan_hash_and_unset_ones_keep_older_checkpoints_resumable():
    from omegaconf import OmegaConf
    from dflash.config import compose
    from dflash.resume import plan_hash
    cfg = compose("train", ["data=world"])
    older = OmegaConf.create(OmegaConf.to_container(cfg))
    del older.buckets["max_batch_size"]  # a config from before the key existed
    assert plan_hash(cfg) == plan_hash(older)
    capped = compose("train", ["data=world", "buckets.max_batch_size=[4,4,4,4,4,4]"])
    assert plan_hash(capped) != plan_hash(cfg)
