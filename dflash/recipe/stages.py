"""Stages that a rerun skips: each writes a marker with its command, the digest of the
stages before it and its wall time; a stage is done when its marker matches.

A stage whose app returned without finishing (a stop signal checkpointed it) or was
ended by a signal leaves no marker, so the same command goes on from there; an app that
fails is a `StageFailed` (a tool's failure, not a setting's).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from dflash.errors import ToolError, UserError


class StageStopped(UserError):
    """A stage's app returned without finishing its work (a stop signal checkpointed it,
    or ended it): no marker is written, so the same command goes on from there."""


class StageFailed(ToolError):
    """A stage's app failed: what it printed says why."""


def run_app(module: str, args: list) -> None:
    """One of dflash's apps in its own process (its output streams through). Ctrl-C
    reaches the app from the terminal (training checkpoints on it) while this process
    waits for it: subprocess.run would kill the app a quarter second after the key."""
    import signal
    import threading
    cmd = [sys.executable, "-m", module, *map(str, args)]
    proc = subprocess.Popen(cmd)
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        rc = proc.wait()
    finally:
        if main:
            signal.signal(signal.SIGINT, old)
    if rc < 0:  # a signal ended it: its parts / checkpoints are what the rerun goes on from
        import signal
        raise StageStopped(f"stage {module} was stopped by {signal.Signals(-rc).name}; rerun "
                           "the same command to go on (finished stages are skipped)")
    if rc != 0:
        raise StageFailed(f"stage {module} ended with status {rc}; fix what it printed and "
                          "rerun: finished stages are skipped")


def train_finished(run_dir: Path) -> str | None:
    """None once the train app finished its run in `run_dir`, else why not."""
    summary = Path(run_dir) / "summary.json"
    if not summary.exists():
        return "it wrote no summary.json"
    stopped = json.loads(summary.read_text()).get("preempted")
    return f"{stopped} stopped it (checkpointed)" if stopped else None


class Stages:
    """Runs stages in order, skipping those done with the same command after the same
    earlier stages: a stage that is redone (new prompts, say) redoes every stage after
    it, whose inputs it rewrote."""

    def __init__(self, work: Path):
        self.work = work
        self.marks = work / "stages"
        self.marks.mkdir(parents=True, exist_ok=True)
        self.seconds: dict = {}
        self.upstream = ""  # a digest of the earlier stages' runs

    def _chain(self, stamp: str) -> None:
        self.upstream = hashlib.sha1(f"{self.upstream}/{stamp}".encode()).hexdigest()[:12]

    def run(self, name: str, command: list, action, on_redo=None, unfinished=None) -> None:
        """`on_redo()`: called before a stage that ran before is redone (to clear
        what its earlier run left that the new one must not continue from);
        `unfinished()`: after the action, None when the stage's work is complete, else
        why not (the stage then has no marker and the same command resumes it)."""
        mark = self.marks / f"{name}.json"
        old = json.loads(mark.read_text()) if mark.exists() else None
        if old and old.get("command") == command and old.get("upstream") == self.upstream:
            self.seconds[name] = old["seconds"]
            print(f"[{name}] done before ({self.seconds[name]:.0f} s): skipped", flush=True)
            self._chain(old["stamp"])
            return
        if old and on_redo is not None:
            on_redo()
        print(f"[{name}] {' '.join(map(str, command))}", flush=True)
        t0 = time.perf_counter()
        action()
        why = unfinished() if unfinished is not None else None
        if why:
            raise StageStopped(f"stage {name} did not finish: {why}; rerun the same command "
                               "to go on from there")
        self.seconds[name] = time.perf_counter() - t0
        stamp = str(time.time_ns())
        mark.write_text(json.dumps({"command": command, "upstream": self.upstream,
                                    "seconds": self.seconds[name], "stamp": stamp}))
        self._chain(stamp)
        print(f"[{name}] {self.seconds[name]:.0f} s", flush=True)
