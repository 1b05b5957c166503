"""`--multirun` comparison of shuffle strategies, W&B offline runs, sweep dir names."""

import pytest

from tests.helpers.run import run_module
from dflash.comparison import pareto, rows_from_summaries
from dflash.config import safe_dirname


def test_rows_compare_acceptance_at_equal_time_and_pareto():
    a = {"train_seconds": 10.0, "initial_acceptance_length": 1.0, "acceptance_length": 3.0,
         "eval_curve": [{"train_seconds": 5.0, "acceptance_length": 2.0}],
         "padding_efficiency": 0.9, "length_mixing": 0.1}
    b = {"train_seconds": 20.0, "initial_acceptance_length": 1.0, "acceptance_length": 4.0,
         "eval_curve": [{"train_seconds": 10.0, "acceptance_length": 1.5}],
         "padding_efficiency": 0.5, "length_mixing": 0.9}
    c = {"train_seconds": 12.0, "initial_acceptance_length": 1.0, "acceptance_length": 2.0,
         "padding_efficiency": 0.4, "length_mixing": 0.5}
    rows = rows_from_summaries([("a", a), ("b", b), ("c", c)])
    assert [r["acceptance_at_equal_time"] for r in rows] == pytest.approx([3.0, 1.5, 1.0 + 10 / 12])
    assert pareto(rows) == [0, 1]  # c is beaten by b on both axes


def test_sweep_dir_names_are_short_and_flat(tmp_path):
    long = "buckets.boundaries=[" + ",".join(str(16 * i) for i in range(1, 56)) + "]"
    name = safe_dirname(long)
    assert len(name) <= 80 and "/" not in name
    assert safe_dirname(long) == name and safe_dirname(long + "x") != name
    assert "/" not in safe_dirname("data.path=/data/chats,model.target.path=/m/q")
    # the real multirun with a 55-value list and a path override
    sweep = tmp_path / "sweep"
    bounds = "[" + ",".join([str(16 + 64 * i) for i in range(54)] + ["8193"]) + "]"  # 55 values
    run_module("dflash.plan", "-m", f"buckets.boundaries={bounds}", "buckets.kind=fixed",
               f"report={tmp_path / 'r.json'}", "data.num_samples=3000", f"hydra.sweep.dir={sweep}",
               "epochs=1")
    jobs = [p for p in sweep.iterdir() if p.is_dir()]
    assert len(jobs) == 1 and len(jobs[0].name) <= 90
