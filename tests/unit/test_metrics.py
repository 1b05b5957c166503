import numpy as np
import pytest

from dflash.batching import PackingSpec, Planner
from dflash.batching.boundaries import computed_boundaries, preset_boundaries
from dflash.batching.metrics import bucket_table, length_mixing, pair_repeat_rate
from dflash.batching.report import plan_report

SEED6 = preset_boundaries("seed6")


def test_token_totals_past_int32_are_exact():
    # 300,000 samples of 8,000 tokens: 2.4e9 useful tokens, beyond 2**31.
    lengths = np.full(300_000, 8000, dtype=np.int32)
    lengths[::7] = 7999
    plan = Planner("sorted", lengths, [0, 8192], PackingSpec(49152, 64)).epoch(0)
    exact = int(lengths.astype(object).sum())
    assert exact > 2**31
    assert plan.useful_tokens == exact
    padded = sum(int(b.batch_size) * int(b.seq_len) for b in plan.batches())
    assert plan.padded_tokens == padded > 2**31
    rows = bucket_table(plan, np.array([0, 8192]))
    assert rows[0]["useful_tokens"] == exact and rows[0]["padded_tokens"] == padded
    assert 0.99 < plan.padding_efficiency <= 1.0


def test_pair_repeat_rate_counts_shared_pairs():
    lengths = np.array([10] * 6)
    a = Planner("random", lengths, [0, 11], PackingSpec(30, 3), seed=0).epoch(0)
    # same plan twice: every pair repeats
    assert pair_repeat_rate(a, a, 6) == 1.0
    # hand-made next epoch: batches {0,1,2},{3,4,5} vs {0,1,3},{2,4,5}: 2 of 6 pairs repeat
    from dflash.batching.epoch_plan import EpochPlan
    p = EpochPlan.build(0, np.arange(6), np.array([0, 3, 6]), np.zeros(2), lengths)
    q = EpochPlan.build(1, np.array([0, 1, 3, 2, 4, 5]), np.array([0, 3, 6]), np.zeros(2), lengths)
    assert pair_repeat_rate(p, q, 6) == pytest.approx(2 / 6)


def test_length_mixing_extremes():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 1000, 5000)
    spec = PackingSpec(4000, 32)
    assert length_mixing(Planner("sorted", lengths, [0, 1000], spec).epoch(0), lengths) < 0.02
    assert length_mixing(Planner("random", lengths, [0, 1000], spec).epoch(0), lengths) > 0.8


def test_seed_profile_at_full_size(full_lengths):
    """The trade-off users choose between, on the production length profile."""
    assert len(full_lengths) == 902087
    reports = {}
    for strategy in ("sorted", "random", "bucketed", "megabatch"):
        spec = PackingSpec(49152, 64, sort_window=4 if strategy == "megabatch" else 0)
        reports[strategy] = plan_report(Planner(strategy, full_lengths, SEED6, spec), epochs=2)
    s, r, b, m = (reports[k] for k in ("sorted", "random", "bucketed", "megabatch"))
    assert s["padding_efficiency"] > 0.995 and s["pair_repeat_rate"] == 1.0
    assert r["pair_repeat_rate"] < 0.01 and r["length_mixing"] > 0.9
    for mid in (b, m):
        assert r["padding_efficiency"] < mid["padding_efficiency"] < s["padding_efficiency"]
        assert s["length_mixing"] < mid["length_mixing"] < r["length_mixing"]
        assert mid["pair_repeat_rate"] < 0.01
    for rep in reports.values():
        assert rep["useful_tokens"] == int(full_lengths.sum())
        assert sum(row["samples"] for row in rep["buckets"]) == 902087


def test_profile_statistics(full_lengths):
    x = full_lengths
    assert x.min() >= 65 and x.max() <= 8191
    assert abs(x.mean() - 2068) < 40
    assert abs(np.percentile(x, 50) - 1727) < 30
    assert abs(np.percentile(x, 95) - 4374) < 40
    assert abs(np.percentile(x, 99) - 4917) < 80
    assert abs(((x >= 1024) & (x < 4096)).mean() - 0.62) < 0.01


@pytest.mark.parametrize("kind", ["geometric", "quantile", "equal_tokens"])
def test_computed_presets_cover_the_data(kind, full_lengths):
    b = computed_boundaries(kind, full_lengths, 6)
    assert b[0] == 0 and b[-1] == full_lengths.max() + 1 and len(b) == 7
    assert (np.diff(b) > 0).all()
    counts = np.bincount(np.searchsorted(b, full_lengths, side="right") - 1)
    if kind == "quantile":
        assert counts.min() > 0.8 * len(full_lengths) / 6
    if kind == "equal_tokens":
        mass = np.bincount(np.searchsorted(b, full_lengths, side="right") - 1, weights=full_lengths)
        assert mass.min() > 0.8 * full_lengths.sum() / 6


def test_quantile_ties_collapse():
    lengths = np.array([5] * 100 + [9])
    b = computed_boundaries("quantile", lengths, 6)
    assert (np.diff(b) > 0).all() and b[-1] == 10
