"""Checkpoints and exact resume: killed, preempted, corrupt, or resumed under a new plan."""
import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.paths import REPO
from tests.helpers.run import WORLD, run_module, torchrun_ok
from dflash import resume as state
from dflash.errors import DataError


def _args(cache, run, *extra, cadence="checkpoint.every_steps=5", steps=40, epochs=2):
    return [sys.executable, "-m", "dflash.train", *WORLD, f"data.cache_dir={cache}",
            "eval.enabled=false", "logger.progress=false", f"epochs={epochs}",
            f"optim.max_steps={steps}",
            cadence, "pipeline.depth=2", "warmup=none", f"hydra.run.dir={run}", *extra]


def _finish(cache, run, *extra, cadence="checkpoint.every_steps=5"):
    """The same command run to its end (in this process: the kill is what needs another)."""
    proc = run_module("dflash.train", *_args(cache, run, *extra, cadence=cadence)[3:], check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((run / "summary.json").read_text())


def _wait_for(path, proc, timeout=200):
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.time() - t0 < timeout
        time.sleep(0.05)


def _final(run):
    """Final weights and the (epoch, batch) sequence the drafter trained on."""
    _, _, st = state.newest_valid(run / "checkpoints")
    return load_file(str(run / "drafter" / "model.safetensors")), st["batches_seen"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, world_cache):
    run = tmp_path_factory.mktemp("uninterrupted")
    summary = _finish(world_cache, run)
    assert summary["steps"] == 40 and summary["resumed_from"] is None
    return _final(run)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "SIGKILL during a checkpoint write"])
def test_interrupted_run_resumes_exactly(tmp_path, world_cache, reference, how):
    import os
    run = tmp_path / "run"
    during_write = how.endswith("write")
    env = {**os.environ, "DFLASH_FAULT_CHECKPOINT_PAUSE": "3" if during_write else "0"}
    proc = subprocess.Popen(_args(world_cache, run), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    if during_write:  # step 10's state file is on disk, its metadata not yet
        _wait_for(run / "checkpoints" / "step-000000005", proc)
        t0 = time.time()
        while not list((run / "checkpoints").glob(".tmp-step-000000010-*/state.pt")):
            assert proc.poll() is None and time.time() - t0 < 200
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=120)
        assert not (run / "checkpoints" / "step-000000010").exists()
    else:
        _wait_for(run / "checkpoints" / "step-000000010", proc)
        proc.send_signal(getattr(signal, how))
    _, err = proc.communicate(timeout=120)
    if how == "SIGTERM":  # saves at the next step boundary and exits cleanly
        assert proc.returncode == 0, err[-2000:]
        cut = json.loads((run / "summary.json").read_text())
        assert cut["preempted"] == "SIGTERM" and 10 <= cut["steps"] < 40
        assert (run / "checkpoints" / f"step-{cut['steps']:09d}").exists()
    else:
        assert proc.returncode == -signal.SIGKILL
    summary = _finish(world_cache, run, "resume=auto")
    if during_write:  # the partial write was never loaded: back to step 5
        assert summary["resumed_from"].endswith("step-000000005")
    assert summary["resumed_from"] and summary["steps"] == 40
    weights, seen = _final(run)
    ref_weights, ref_seen = reference
    assert seen == ref_seen and len(seen) == 40 and len(set(map(tuple, seen))) == 40
    assert all(torch.equal(weights[k], ref_weights[k]) for k in ref_weights)


def test_a_wall_clock_cadence_bounds_the_work_a_kill_loses(tmp_path, world_cache, reference):
    """checkpoint.every_minutes alone (no step cadence): a kill -9 loses at most that
    much wall clock (plus the step in flight), and the rerun still ends exactly."""
    run, minutes = tmp_path / "run", 0.02  # 1.2 s
    cadence = f"checkpoint.every_minutes={minutes}"
    proc = subprocess.Popen(_args(world_cache, run, "checkpoint.every_steps=0", cadence=cadence),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ckpts = run / "checkpoints"
    _wait_for(ckpts, proc)
    t0 = time.time()
    while len(list(ckpts.glob("step-*"))) < 2:
        assert proc.poll() is None and time.time() - t0 < 200, "fewer than 2 timed saves"
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    killed = time.time()
    proc.communicate(timeout=120)
    saves = sorted(ckpts.glob("step-*"))
    newest = max(p.stat().st_mtime for p in saves)
    step_seconds = 1.5  # generous: one step of this world on 2 cores is ~0.1 s
    assert killed - newest <= 60 * minutes + step_seconds, (killed - newest, saves)
    steps = [int(p.name.split("-")[1]) for p in saves]
    assert steps == sorted(steps) and steps[-1] < 40  # saved by the clock, not at the end
    summary = _finish(world_cache, run, "resume=auto", "checkpoint.every_steps=0", cadence=cadence)
    assert summary["resumed_from"] and summary["steps"] == 40
    weights, seen = _final(run)  # seen: up to the newest (timed) save
    assert seen == reference[1][:len(seen)] and len(seen) >= steps[-1]
    assert all(torch.equal(weights[k], reference[0][k]) for k in reference[0])


def test_resume_under_a_changed_plan_is_refused(tmp_path, world_cache):
    run = tmp_path / "run"
    _finish(world_cache, run, "optim.max_steps=10")
    proc = run_module("dflash.train", *_args(world_cache, run, "optim.max_steps=10", "resume=auto",
                                              "seed=1")[3:], check=False)
    assert proc.returncode == 2
    assert "plan settings changed" in proc.stderr and "Traceback" not in proc.stderr


def _save(d, step, value):
    return state.save(d, step, {"w": torch.full((4,), float(value))}, {"plan_hash": "h"}, keep=3)


def test_partial_or_corrupt_checkpoints_are_skipped(tmp_path, caplog):
    d = tmp_path / "checkpoints"
    _save(d, 5, 5)
    newest = _save(d, 10, 10)
    (d / ".tmp-step-000000015-1").mkdir()  # a write killed midway
    with open(newest / "state.pt", "r+b") as f:  # a truncated file
        f.truncate(20)
    path, meta, st = state.newest_valid(d)
    assert meta["step"] == 5 and torch.equal(st["w"], torch.full((4,), 5.0))
    assert "does not match its hash" in caplog.text
    with pytest.raises(DataError, match="truncated or corrupt"):
        state.read(newest)
    for step in (15, 20, 25):
        _save(d, step, step)
    assert [p.name for p in sorted(d.glob("step-*"))] == [
        "step-000000015", "step-000000020", "step-000000025"]


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    d = tmp_path / "checkpoints"
    _save(d, 5, 5)

    def no_space(*_a, **_k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", no_space)
    with pytest.raises(DataError, match="No space left on device.*step-000000005"):
        _save(d, 10, 10)
    monkeypatch.undo()
    assert state.newest_valid(d)[1]["step"] == 5 and not list(d.glob(".tmp-*"))


def _odd_batch_budget(cache, tmp_path) -> int:
    """A token budget whose epoch plan has a batch count 2 ranks cannot split evenly."""
    from omegaconf import OmegaConf
    from dflash.batching.strategies import build_planner
    from tests.helpers.run import build_trainer
    r = build_trainer(cache, tmp_path / "probe", "epochs=1", "logger.progress=false")
    for budget in range(4096, 2048, -64):
        b = OmegaConf.merge(r.cfg.batching, {"token_budget": budget})
        if build_planner(b, r.sources.data.lengths, r.boundaries, 0).epoch(0).num_batches % 2:
            return budget
    raise AssertionError("no budget gives an odd batch count")


def test_two_gloo_ranks_preempted_then_resumed(tmp_path, world_cache):
    """topology=pairs on CPU through torchrun, over an epoch whose batch count 2 does not
    divide: the uninterrupted pair runs it whole without a hang, replicas equal. torchrun
    forwards SIGTERM to both ranks; they agree at the metric sync, both stop after the
    same step, and the resumed pair ends with the uninterrupted pair's weights."""
    budget = _odd_batch_budget(world_cache, tmp_path)

    def cmd(run, port, *extra):
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                f"--master_port={port}", *_args(world_cache, run, "topology=pairs",
                                                "logger.log_every=5",
                                                f"batching.token_budget={budget}", *extra,
                                                epochs=1)[1:]]
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    # the uninterrupted pair and the pair to interrupt run side by side (their ranks
    # spend most of their time starting up; the runs are deterministic, so sharing
    # the cores changes when they finish, not what they compute)
    ref, run = tmp_path / "ref", tmp_path / "run"
    ref_proc = subprocess.Popen(cmd(ref, 29531), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(cmd(run, 29533), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(run / "checkpoints" / "step-000000005", proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        _, ref_err = ref_proc.communicate(timeout=300)
    finally:
        for p in (proc, ref_proc):
            if p.poll() is None:
                p.kill()
                p.wait()
    torchrun_ok(subprocess.CompletedProcess(ref_proc.args, ref_proc.returncode, "", ref_err))
    a = json.loads((ref / "summary.json").read_text())
    assert a["world_size"] == 2 and a["batches_per_epoch"] % 2 == 1
    assert a["steps"] == a["steps_per_epoch"] == (a["batches_per_epoch"] + 1) // 2
    assert len(a["replica_digests"]) == 2 and len(set(a["replica_digests"])) == 1
    cut = json.loads((run / "summary.json").read_text())
    assert cut["preempted"] and cut["steps"] < a["steps"], err[-2000:]
    torchrun_ok(subprocess.run(cmd(run, 29531, "resume=auto"), cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=300))
    b = json.loads((run / "summary.json").read_text())
    assert b["resumed_from"] and b["steps"] == a["steps"]
    assert b["replica_digests"] == a["replica_digests"]


def test_preemption_under_slurm_checkpoints_then_requeues(tmp_path, world_cache):
    """SIGUSR1 (SLURM's warning) or SIGUSR2 (submitit's): checkpoint, exit 0, and
    `scontrol requeue` the job, so the requeued job resumes with resume=auto."""
    import os
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scontrol.log"
    fake = bin_dir / "scontrol"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    run = tmp_path / "run"
    proc = subprocess.Popen(_args(world_cache, run), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    _wait_for(run / "checkpoints" / "step-000000005", proc)
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    cut = json.loads((run / "summary.json").read_text())
    assert cut["preempted"] == "SIGUSR2" and cut["requeued"] == "4242"
    assert log.read_text().split() == ["requeue", "4242"]
    assert (run / "checkpoints" / f"step-{cut['steps']:09d}").exists()


def test_resume_auto_in_another_runs_dir_is_refused_naming_what_differs(tmp_path, world_cache):
    """A dir holds one run: a rerun under another loss, rate or drafter shape is refused in
    one line before anything is built; force_resume lets what is safe through."""
    run = tmp_path / "run"
    _finish(world_cache, run, "optim.max_steps=10")
    assert json.loads((run / "identity.json").read_text())["optim"]["optim.lr"] == 3e-3

    def again(*extra):
        return run_module("dflash.train", *_args(world_cache, run, "optim.max_steps=10",
                                                  "resume=auto", *extra)[3:], check=False)
    changed = again("optim.lr=1e-2", "loss=dpace")
    assert changed.returncode == 2 and "Traceback" not in changed.stderr
    line = changed.stderr.strip().splitlines()[-1]
    assert "holds another run" in line and "optim.lr 0.003 -> 0.01" in line
    assert "loss.kind ce -> dpace" in line and "force_resume" in line
    shape = again("model.drafter.num_layers=2", "checkpoint.force_resume=true")
    assert shape.returncode == 2 and "Traceback" not in shape.stderr
    assert "model.drafter.num_layers 1 -> 2" in shape.stderr and "cannot load" in shape.stderr
    forced = again("optim.lr=1e-2", "checkpoint.force_resume=true")
    assert forced.returncode == 0, forced.stderr[-2000:]
    resumed = json.loads((run / "summary.json").read_text())["resumed_from"]
    assert resumed and resumed.endswith("step-000000010")
