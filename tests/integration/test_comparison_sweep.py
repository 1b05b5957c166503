"""`--multirun` comparison of shuffle strategies, W&B offline runs, sweep dir names."""
import json

from dflash.config import safe_dirname
from tests.helpers.paths import REPO
from tests.helpers.run import WORLD, run_module


def test_compare_shuffles_multirun_writes_the_comparison(tmp_path, world_cache):
    """2 strategies x 2 paired seeds on the small world: rows per job, intervals over
    seeds, verdicts against the best, time to the target acceptance, the plot."""
    sweep = tmp_path / "sweep"
    proc = run_module("dflash.train", "-m", "experiment=compare_shuffles", *WORLD,
                      f"data.cache_dir={world_cache}", "eval.num_prompts=4", "eval.max_new_tokens=8",
                      "optim.max_tokens=9000", "eval.every_steps=2", "logger.mode=offline",
                      "logger.progress=false", "warmup=none", f"hydra.sweep.dir={sweep}",
                      # two of the experiment's six strategies and two of its three seeds keep
                      # the suite short (the full list is checked by the compose test); fewer
                      # packed anchor slots keep the packed job as short as the sorted one
                      "shuffle=sorted,packed", "seed=0,1", "batching.anchors_per_row=64",
                      timeout=600)
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name[0].isdigit())
    assert len(jobs) == 4, proc.stdout[-2000:]
    rows = json.loads((sweep / "comparison.json").read_text())
    assert sorted((r["group"], r["seed"]) for r in rows) == sorted(
        (f"shuffle={s}", seed) for s in ("sorted", "packed") for seed in (0, 1))
    target = rows[0]["target_acceptance"]
    assert target == min(r["acceptance_length"] for r in rows)  # every job reaches it
    for r in rows:
        assert {"strategy", "padding_efficiency", "tokens_per_second", "pair_repeat_rate",
                "length_mixing", "final_loss", "acceptance_length"} <= set(r)
        assert r["acceptance_at_equal_time"] >= 1 and len(r["curve"]) >= 3
        assert r["time_to_target"] is not None and r["steps_to_target"] is not None
        assert r["acceptance_bootstrap"]["prompts"] == 4
        # the same budget of real tokens: every job stops just past it
        assert 9000 <= r["real_tokens"] < 9000 + 4096
        # the strategy's intervals over its two seeds, and a verdict per judged metric
        acc = r["over_seeds"]["acceptance_length"]
        assert acc["n"] == 2 and acc["lo"] <= acc["mean"] <= acc["hi"]
        for metric in ("acceptance_length", "acceptance_at_equal_time", "time_to_target",
                       "tokens_per_second"):
            v = r["verdicts"][metric]["verdict"]
            assert v == "best" or v.startswith(("better by", "no difference detectable"))
    by = {r["group"]: r for r in rows}
    # packed: random's diversity at (better than) sorted's efficiency
    assert by["shuffle=packed"]["padding_efficiency"] > 0.95
    assert by["shuffle=packed"]["pair_repeat_rate"] < by["shuffle=sorted"]["pair_repeat_rate"]
    md = (sweep / "comparison.md").read_text()
    assert "| shuffle=packed | 2 |" in md and "Verdicts" in md and "Eval noise" in md
    assert (sweep / "comparison.png").stat().st_size > 10_000
    # one offline W&B run per job, each in its own run dir, plus the comparison's
    for job in jobs:
        assert len(list((job / "wandb").glob("offline-run-*"))) == 1
        summary = json.loads((job / "summary.json").read_text())
        assert summary["group"] == sweep.name and summary["loss_norm"] == "plan"
        assert (job / "eval.jsonl").read_text().count("\n") >= 3
    assert len(list((sweep / "wandb").glob("offline-run-*"))) == 1
    # paired seeds: seed s starts every strategy from the same drafter
    init = {(r["group"], r["seed"]): r["curve"][0][3] for r in rows}
    assert init[("shuffle=sorted", 0)] == init[("shuffle=packed", 0)]


def test_plan_multirun_keeps_one_entry_per_setting(tmp_path):
    """The documented command, as written (docs/commands.md); and runs differing only in
    topology or balancing no longer overwrite each other in the report."""
    report = tmp_path / "cmp.json"
    run_module("dflash.plan", "--multirun", "experiment=compare_batching", f"report={report}",
               "batching=sorted,random", "data.num_samples=5000", "topology=cpu,8gpu",
               "batching.balance_steps=false,true", f"hydra.sweep.dir={tmp_path / 's'}")
    assert len(json.loads(report.read_text())) == 8
    documented = (REPO / "docs" / "commands.md").read_text()
    assert "python -m dflash.plan --multirun experiment=compare_batching report=cmp.json" in documented


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
