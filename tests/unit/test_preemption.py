"""Stop signals before and after training starts; the command a stopped run prints."""
import os
import shlex
import signal
import time

import pytest
import torch

from dflash.preemption import (Preempted, SignalStop, StopSignals, signal_received,
                               training_started)
from dflash.run.stop import continue_command
from dflash.topology import Topology

CPU = torch.device("cpu")


def _deliver(sig):
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # Python runs the handler at the next bytecode


def test_a_stop_signal_before_training_stops_at_once_and_after_it_is_remembered():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    with StopSignals():
        with pytest.raises(Preempted) as stopped:  # setup: nothing to save, stop now
            _deliver(signal.SIGTERM)
        assert stopped.value.signame == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]
    assert signal_received() is None
    with StopSignals():
        stop = SignalStop(Topology(0, 1, 0, CPU, CPU))  # the training loop takes over
        _deliver(signal.SIGUSR1)
        assert stop.requested(step=3, every=1) == "SIGUSR1"
        stop.restore()
        _deliver(signal.SIGTERM)  # after the last step (evaluating): remembered, no raise
        assert signal_received() == "SIGTERM"
        training_started()
    assert {s: signal.getsignal(s) for s in before} == before and signal_received() is None


def test_ctrl_c_stops_like_a_preemption_and_a_second_one_interrupts(monkeypatch, tmp_path):
    from dflash.preemption import requeue_job
    before = signal.getsignal(signal.SIGINT)
    with StopSignals():
        with pytest.raises(Preempted) as stopped:  # setup: nothing to save, stop now
            _deliver(signal.SIGINT)
        assert stopped.value.signame == "SIGINT"
    with StopSignals():
        stop = SignalStop(Topology(0, 1, 0, CPU, CPU))
        _deliver(signal.SIGINT)  # training: asked to checkpoint and stop, no exception
        assert stop.requested(step=3, every=1) == "SIGINT"
        with pytest.raises(KeyboardInterrupt):  # the second press does not wait
            _deliver(signal.SIGINT)
        stop.restore()
    assert signal.getsignal(signal.SIGINT) is before
    # a person stopped it: no SLURM requeue (a preemption's is asked for)
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'asked'}\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert requeue_job("auto", "SIGINT") is None and not (tmp_path / "asked").exists()
    assert requeue_job("auto", "SIGTERM") == "77"
    assert (tmp_path / "asked").read_text().split() == ["requeue", "77"]


def test_the_command_that_goes_on_pins_the_dir_and_resumes():
    argv = ["-m", "experiment=compare_shuffles", "hydra.sweep.dir=old", "resume=never",
            "data.path=/my data/x.jsonl"]
    cmd = shlex.split(continue_command("dflash.train", argv, "hydra.sweep.dir", "out/s 1"))
    assert cmd == ["python", "-m", "dflash.train", "-m", "experiment=compare_shuffles",
                   "data.path=/my data/x.jsonl", "hydra.sweep.dir=out/s 1", "resume=auto"]
