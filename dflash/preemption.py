"""Preemption: SIGTERM / SIGUSR1 / SIGUSR2 ask the run to checkpoint and stop at the next
step boundary (every rank after the same step), and the SLURM job is requeued after it.
Ctrl-C (SIGINT) stops the same way, without the requeue (a person stopped it); a second
Ctrl-C interrupts at once.

Before training starts there is nothing to save, so a signal then stops the app at once
(`StopSignals` raises `Preempted`): a target load or a data build can take minutes, more
than a scheduler's grace period. From the first step on, `SignalStop` takes over."""
from __future__ import annotations

import logging
import os

import torch

from dflash.errors import ConfigError

log = logging.getLogger("dflash.preemption")


def requeue_job(policy: str, signame: str | None = None) -> str | None:
    """After a preemption checkpoint: ask SLURM to requeue this job (what submitit does
    for its own checkpointable jobs). Returns what was done, for the summary; a failed
    request is a warning, never an error (the checkpoint is already safe). A run stopped
    by Ctrl-C (`signame` SIGINT) is not requeued."""
    import subprocess
    policy = str(policy).lower()
    if policy not in ("auto", "true", "false"):
        raise ConfigError(f"checkpoint.requeue must be auto, true or false, got {policy!r}")
    if signame == "SIGINT":
        return None
    job = os.environ.get("SLURM_ARRAY_JOB_ID") and (
        f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}")
    job = job or os.environ.get("SLURM_JOB_ID")
    if policy == "false" or (policy == "auto" and not job):
        return None
    if not job:
        log.warning("checkpoint.requeue=true but SLURM_JOB_ID is not set: not requeued")
        return None
    try:
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True,
                       text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not requeue SLURM job %s (%s); resume it with resume=auto", job, exc)
        return None
    log.info("requeued SLURM job %s", job)
    return job


# SIGUSR2: submitit's preemption signal; SIGINT: Ctrl-C (a traceback and no checkpoint before)
SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")


def _install(handler) -> dict:
    """`handler` for every stop signal (main thread only: Python's rule); the handlers
    it replaced, for `_restore`."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, handler)
            for sig in (getattr(signal, name, None) for name in SIGNALS) if sig is not None}


def _second_press_interrupts(signum) -> None:
    """After a first Ctrl-C (a stop asked for), the next one interrupts at once; the
    handler `_install` replaced comes back with `_restore`."""
    import signal
    if signum == signal.SIGINT:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _restore(old: dict) -> None:
    import signal
    for sig, handler in old.items():
        signal.signal(sig, handler)


class Preempted(BaseException):
    """A stop signal arrived before training began: nothing trained, nothing to save.
    (A BaseException, like KeyboardInterrupt: no `except Exception` on the way swallows it.)"""

    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


_ACTIVE: "StopSignals | None" = None


class StopSignals:
    """An app's signal handling from its first line: until training starts, a stop
    signal raises `Preempted`; after that it is only remembered (`signame`), so an
    evaluation after training finishes and the app can still say it was asked to stop."""

    def __init__(self):
        self.signum, self.raising, self.old = None, True, {}

    def __enter__(self):
        global _ACTIVE
        self.old, _ACTIVE = _install(self._handle), self
        return self

    def __exit__(self, *exc):
        global _ACTIVE
        _restore(self.old)
        _ACTIVE = None
        return False

    def _handle(self, signum, _frame):
        self.signum = signum
        _second_press_interrupts(signum)
        if self.raising:
            self.raising = False  # one raise: the unwinding must not be interrupted again
            raise Preempted(self.signame)

    @property
    def signame(self) -> str | None:
        import signal
        return signal.Signals(self.signum).name if self.signum else None


def training_started() -> None:
    """From here on a stop signal is the training loop's to handle (checkpoint first)."""
    if _ACTIVE is not None:
        _ACTIVE.raising = False


def signal_received() -> str | None:
    """The stop signal the app received so far (its name), else None."""
    return _ACTIVE.signame if _ACTIVE is not None else None


class SignalStop:
    """SIGTERM / SIGUSR1 (what SLURM sends before preemption) ask the run to checkpoint
    and stop at the next step boundary. With several ranks the request is agreed at the
    metric syncs (an all-reduce), so every rank stops after the same step."""

    def __init__(self, topo):
        training_started()
        self.topo, self.signum = topo, None
        self.old = _install(self._handle)

    def _handle(self, signum, _frame):
        self.signum = signum
        if _ACTIVE is not None:
            _ACTIVE.signum = signum
        _second_press_interrupts(signum)

    def requested(self, step: int, every: int):
        """The signal's name when the run should stop now, else None."""
        import signal
        flag = self.signum is not None
        if self.topo.distributed:
            if step % every:
                return None
            import torch.distributed as dist
            t = torch.tensor([int(flag)], device=self.topo.drafter_device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            flag = bool(t.item())
        if not flag:
            return None
        return signal.Signals(self.signum).name if self.signum else "SIGTERM"

    def restore(self) -> None:
        _restore(self.old)
        self.old = {}
