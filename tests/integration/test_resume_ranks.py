"""Resume across processes and runs: two gloo ranks preempted and resumed, a SLURM
preemption requeued, and a dir that holds another run (tests/integration/test_resume.py
has the single-process kills; the two files run on separate workers)."""
import json
import signal
import subprocess
import sys

from tests.helpers.paths import REPO
from tests.helpers.run import run_module, torchrun_ok
from tests.integration.test_resume import _args, _finish, _wait_for


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
