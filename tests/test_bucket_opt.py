import numpy as np
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from dflash.batching import DataError, PackingSpec
from dflash.batching.bucket_opt import (build_cost_table, choose_auto, exhaustive_fit,
                                        optimal_fits, simulate)
from dflash.batching.buckets import computed_boundaries, preset_boundaries
from conftest import run_module

SEED6 = preset_boundaries("seed6")


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_dp_equals_exhaustive_search(data):
    budget = data.draw(st.integers(200, 3000))
    lengths = np.array(data.draw(st.lists(st.integers(1, budget // 2), min_size=4, max_size=200)))
    table = build_cost_table(lengths, PackingSpec(budget, data.draw(st.integers(2, 16))),
                             candidates=data.draw(st.integers(4, 9)))
    k_max = min(4, table.num_bins)
    for fit in optimal_fits(table, k_max):
        brute = exhaustive_fit(table, fit.num_buckets)
        assert fit.predicted_efficiency == pytest.approx(brute.predicted_efficiency, rel=1e-12)


def test_estimate_matches_exact_simulation(full_lengths):
    spec = PackingSpec(49152, 64)
    table = build_cost_table(full_lengths, spec)
    for boundaries in (SEED6, computed_boundaries("quantile", full_lengths, 4)):
        b = np.asarray(boundaries)
        cuts = np.searchsorted(table.edges, np.clip(b, table.edges[0], table.edges[-1]))
        predicted = table.useful.sum() / sum(table.padded[a, c] for a, c in zip(cuts[:-1], cuts[1:]))
        exact = simulate(full_lengths, b, spec)["efficiency"]
        assert abs(predicted - exact) < 0.005, (boundaries, predicted, exact)


def test_optimum_beats_presets_by_exact_simulation(full_lengths):
    spec = PackingSpec(49152, 64)
    fit = optimal_fits(build_cost_table(full_lengths, spec), 6)[-1]
    best = simulate(full_lengths, fit.boundaries, spec)["efficiency"]
    assert best > simulate(full_lengths, SEED6, spec)["efficiency"]
    assert best > simulate(full_lengths, computed_boundaries("quantile", full_lengths, 6),
                           spec)["efficiency"]
    assert abs(best - fit.predicted_efficiency) < 0.005


def test_totals_past_int32_are_exact():
    rng = np.random.default_rng(0)
    lengths = rng.integers(7000, 8001, 400_000)
    assert int(lengths.sum()) > 2**31
    table = build_cost_table(lengths, PackingSpec(49152, 64), candidates=32)
    assert table.useful.sum() == float(int(lengths.sum()))
    assert table.counts.sum() == len(lengths)
    fit = optimal_fits(table, 3)[-1]
    assert 0.9 < fit.predicted_efficiency <= 1.0
    sim = simulate(lengths, fit.boundaries, PackingSpec(49152, 64), epochs=1)
    assert 0.9 < sim["efficiency"] <= 1.0


def test_ties_at_one_length_stay_together():
    lengths = np.array([100] * 3000 + [101] * 3000 + [57] * 10)
    spec = PackingSpec(4096, 32)
    fit = optimal_fits(build_cost_table(lengths, spec), 3)[-1]
    assert fit.boundaries.tolist() == [0, 100, 101, 102]
    assert simulate(lengths, fit.boundaries, spec)["efficiency"] == 1.0
    assert fit.predicted_efficiency == pytest.approx(1.0)


@pytest.mark.parametrize("lengths,k,match", [
    ([5] * 50, 2, "all lengths are equal"),
    ([1, 2, 3], 4, "only 3 candidate boundaries"),
    ([1, 2, 3], 0, "num_buckets must be >= 1"),
])
def test_bad_k(lengths, k, match):
    table = build_cost_table(np.array(lengths), PackingSpec(100, 8))
    with pytest.raises(DataError, match=match):
        optimal_fits(table, k)


def test_bad_inputs():
    with pytest.raises(DataError, match="no samples"):
        build_cost_table(np.array([], dtype=np.int64), PackingSpec(100, 8))
    with pytest.raises(DataError, match="sample 1 has length 500, more than batching.token_budget=100"):
        build_cost_table(np.array([5, 500]), PackingSpec(100, 8))


def test_auto_picks_smallest_k_within_gap():
    rng = np.random.default_rng(2)
    lengths = rng.integers(10, 2000, 20000)
    fits = optimal_fits(build_cost_table(lengths, PackingSpec(16384, 64), candidates=64), 12)
    chosen = choose_auto(fits, 0.02)
    top = fits[-1].predicted_efficiency
    assert chosen.predicted_efficiency >= top - 0.02
    assert all(f.predicted_efficiency < top - 0.02 for f in fits[:chosen.num_buckets - 1])
    effs = [f.predicted_efficiency for f in fits]
    assert all(b >= a - 1e-12 for a, b in zip(effs, effs[1:]))  # more buckets never hurt


def test_attention_aware_cost_is_estimated_too():
    rng = np.random.default_rng(4)
    lengths = rng.integers(50, 4000, 30000)
    spec = PackingSpec(32768, 64)
    q = 1 / 2048
    fit = optimal_fits(build_cost_table(lengths, spec, quadratic=q), 4)[-1]
    sim = simulate(lengths, fit.boundaries, spec, quadratic=q)["efficiency"]
    assert abs(sim - fit.predicted_efficiency) < 0.01
    plain = simulate(lengths, fit.boundaries, spec)["efficiency"]
    assert sim != plain


def _run(*args, check=True):
    return run_module("dflash.buckets", *args, check=check)


def test_app_writes_a_preset_the_plan_can_select(tmp_path):
    rng = np.random.default_rng(5)
    np.save(tmp_path / "len.npy", rng.integers(65, 8000, 20000))
    (tmp_path / "conf" / "buckets").mkdir(parents=True)
    preset = tmp_path / "conf" / "buckets" / "fitted.yaml"
    out = _run(f"lengths_file={tmp_path}/len.npy", "num_buckets=5", f"out={preset}",
               f"plot={tmp_path}/fit.png", f"hydra.run.dir={tmp_path}/run")
    assert "simulated_efficiency=" in out.stdout and "per bucket" in out.stdout
    doc = yaml.safe_load(preset.read_text())
    assert doc["name"] == "fitted" and len(doc["boundaries"]) == 6
    assert 0 < doc["meta"]["simulated_efficiency"] <= 1
    assert (tmp_path / "fit.png").read_bytes()[:4] == b"\x89PNG"
    run_module("dflash.plan", f"lengths_file={tmp_path}/len.npy",
               f"hydra.searchpath=[file://{tmp_path}/conf]", "buckets=fitted",
               f"report={tmp_path}/r.json", f"hydra.run.dir={tmp_path}/run2")
    import json
    (rep,) = json.loads((tmp_path / "r.json").read_text())
    assert rep["boundaries"] == doc["boundaries"]
    assert rep["padding_efficiency"] == pytest.approx(doc["meta"]["simulated_efficiency"], abs=0.01)


def test_app_rejects_bad_files_and_k(tmp_path):
    np.save(tmp_path / "two_d.npy", np.ones((3, 3), dtype=np.int64))
    proc = _run(f"lengths_file={tmp_path}/two_d.npy", f"hydra.run.dir={tmp_path}/r", check=False)
    assert proc.returncode and "expected a 1-D array" in proc.stderr
    np.save(tmp_path / "f.npy", np.array([1.5, 2.0]))
    proc = _run(f"lengths_file={tmp_path}/f.npy", f"hydra.run.dir={tmp_path}/r", check=False)
    assert proc.returncode and "non-integer length" in proc.stderr
    np.save(tmp_path / "ok.npy", np.array([10, 20, 30]))
    proc = _run(f"lengths_file={tmp_path}/ok.npy", "num_buckets=many",
                f"hydra.run.dir={tmp_path}/r", check=False)
    assert proc.returncode and "integer or 'auto'" in proc.stderr
