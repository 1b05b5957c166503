"""Preemption: SIGTERM / SIGUSR1 / SIGUSR2 ask the run to checkpoint and stop at the next
step boundary (every rank after the same step), and the SLURM job is requeued after it."""
from __future__ import annotations

import logging
import os

import torch

from dflash.errors import ConfigError

log = logging.getLogger("dflash.preemption")


def requeue_job(policy: str) -> str | None:
    """After a preemption checkpoint: ask SLURM to requeue this job (what submitit does
    for its own checkpointable jobs). Returns what was done, for the summary; a failed
    request is a warning, never an error (the checkpoint is already safe)."""
    import subprocess
    policy = str(policy).lower()
    if policy not in ("auto", "true", "false"):
        raise ConfigError(f"checkpoint.requeue must be auto, true or false, got {policy!r}")
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


class SignalStop:
    """SIGTERM / SIGUSR1 (what SLURM sends before preemption) ask the run to checkpoint
    and stop at the next step boundary. With several ranks the request is agreed at the
    metric syncs (an all-reduce), so every rank stops after the same step."""

    # SIGUSR2: submitit's preemption / timeout signal (hydra/launcher=submitit_slurm)
    SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2")

    def __init__(self, topo):
        import signal
        import threading
        self.topo, self.signum, self.old = topo, None, {}
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                sig = getattr(signal, name, None)
                if sig is not None:
                    self.old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, _frame):
        self.signum = signum

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
        import signal
        for sig, old in self.old.items():
            signal.signal(sig, old)
        self.old = {}
