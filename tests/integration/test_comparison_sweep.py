"""`--multirun` comparison of shuffle strategies, W&B offline runs, sweep dir names."""
import json
import os
import shlex
import signal
import threading
import time

from dflash.config import safe_dirname
from tests.helpers.paths import REPO
from tests.helpers.run import WORLD, run_module


def _sigterm_while_training(cmd, job_dir_glob, sweep, monkeypatch):
    """Run the sweep (in this process: the signal goes to it like to any other); SIGTERM
    it while `job_dir_glob`'s job is mid training, held in a checkpoint write so that it
    cannot end before the signal arrives."""
    monkeypatch.setenv("DFLASH_FAULT_CHECKPOINT_PAUSE", "0.1")
    done = threading.Event()

    def watch():
        while not done.is_set():
            if list(sweep.glob(f"{job_dir_glob}/checkpoints/.tmp-step-*")):
                os.kill(os.getpid(), signal.SIGTERM)  # the app's handler is in place
                return
            time.sleep(0.01)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return run_module("dflash.train", *cmd, check=False, timeout=600)
    finally:
        done.set()
        watcher.join()
        monkeypatch.delenv("DFLASH_FAULT_CHECKPOINT_PAUSE")


def test_compare_shuffles_multirun_writes_the_comparison(tmp_path, world_cache, monkeypatch):
    """2 strategies x 2 paired seeds on the small world: rows per job, intervals over
    seeds, verdicts against the best, time to the target acceptance, the plot. The sweep
    is preempted first (SIGTERM in its second job): it checkpoints that job, starts no
    other and says how to go on; that command reuses the finished job, resumes the
    stopped one, trains the rest and writes the comparison."""
    sweep = tmp_path / "sweep"
    cmd = ["-m", "experiment=compare_shuffles", *WORLD,
           f"data.cache_dir={world_cache}", "eval.num_prompts=4", "eval.max_new_tokens=8",
           "optim.max_tokens=9000", "eval.every_steps=2", "logger.mode=offline",
           "logger.progress=false", "warmup=none", f"hydra.sweep.dir={sweep}",
           # two of the experiment's six strategies and two of its three seeds keep
           # the suite short (the full list is checked by the compose test); fewer
           # packed anchor slots keep the packed job as short as the sorted one
           "shuffle=sorted,packed", "seed=0,1", "batching.anchors_per_row=64",
           "checkpoint.every_steps=1"]
    stopped_run = _sigterm_while_training(cmd, "1_*", sweep, monkeypatch)
    err = stopped_run.stderr
    said = [line for line in err.splitlines() if line.startswith("dflash: SIGTERM in job 1 ")]
    assert stopped_run.returncode == 0 and len(said) == 1, err[-2000:]
    assert "checkpointed at step" in said[0] and "The sweep stops here" in said[0]
    assert sorted(p.name[:2] for p in sweep.iterdir() if p.name[0].isdigit()) == ["0_", "1_"]
    assert not (sweep / "comparison.json").exists()
    (first,), (stopped,) = sweep.glob("0_*"), sweep.glob("1_*")
    finished = (first / "summary.json").read_text()
    cut = json.loads((stopped / "summary.json").read_text())
    assert cut["preempted"] == "SIGTERM"
    again = shlex.split(said[0].split("To go on: ", 1)[1])
    assert again[:3] == ["python", "-m", "dflash.train"] and again[-1] == "resume=auto"
    proc = run_module("dflash.train", *again[3:], timeout=600)
    assert f"{first}: finished with this config before; reused" in proc.stdout
    assert (first / "summary.json").read_text() == finished  # not trained again
    resumed = json.loads((stopped / "summary.json").read_text())
    assert resumed["resumed_from"].endswith(f"step-{cut['steps']:09d}")
    assert resumed["preempted"] is None and resumed["steps"] > cut["steps"]
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
    # one offline W&B run per job, each in its own run dir, plus the comparison's (the
    # resumed job went on in the run it started: two offline dirs of one run id)
    for job in jobs:
        ids = {p.name.rsplit("-", 1)[1] for p in (job / "wandb").glob("offline-run-*")}
        assert ids == {(job / "wandb_run_id").read_text()}
        summary = json.loads((job / "summary.json").read_text())
        assert summary["group"] == sweep.name and summary["loss_norm"] == "plan"
        assert (job / "eval.jsonl").read_text().count("\n") >= 3
    assert len(list((sweep / "wandb").glob("offline-run-*"))) == 1
    # paired seeds: seed s starts every strategy from the same drafter
    init = {(r["group"], r["seed"]): r["curve"][0][3] for r in rows}
    assert init[("shuffle=sorted", 0)] == init[("shuffle=packed", 0)]


def test_a_sweep_stopped_before_training_says_so_and_starts_no_other_job(
        tmp_path, world_cache, monkeypatch):
    """A stop signal while a job sets up (data, target, plans: minutes for a big target)
    stops it at once: nothing to save, one line, no later job."""
    from dflash.trainer import Trainer
    build = Trainer.build

    def build_after_a_signal(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs here, inside the setup
        return build(self)
    monkeypatch.setattr(Trainer, "build", build_after_a_signal)
    sweep = tmp_path / "sweep"
    proc = run_module("dflash.train", "-m", *WORLD, f"data.cache_dir={world_cache}", "seed=0,1",
                      "logger.progress=false", f"hydra.sweep.dir={sweep}", check=False)
    said = [line for line in proc.stderr.splitlines() if line.startswith("dflash: SIGTERM")]
    assert proc.returncode == 0 and len(said) == 1, proc.stderr[-2000:]
    assert said[0].startswith("dflash: SIGTERM in job 0 (")
    assert "stopped before training began, nothing to save. The sweep stops here" in said[0]
    assert said[0].endswith(f"hydra.sweep.dir={sweep} resume=auto")
    jobs = [p for p in sweep.iterdir() if p.is_dir() and p.name[0].isdigit()]
    assert [p.name[:2] for p in jobs] == ["0_"] and not (jobs[0] / "summary.json").exists()


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
