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
from tests.helpers.run import WORLD, run_module
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
