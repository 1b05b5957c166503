"""Going on after a stop: what a rerun of the same command reuses, and the command to run.

A preempted sweep stops where it is (no later job starts in a job's remaining grace
period) and prints the command that goes on: the same command, pinned to the same sweep
dir, with `resume=auto`. In that rerun a job whose dir holds a finished run of the same
config is reused as it is, the interrupted job resumes from its checkpoint, the jobs
never started train, and the comparison is written once all are done.
"""
from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path

from omegaconf import OmegaConf

log = logging.getLogger("dflash.rerun")

# keys a rerun may change without changing what a finished run computed
RERUN_KEYS = ("resume",)


def _comparable(resolved: dict) -> dict:
    return {k: v for k, v in resolved.items() if k not in RERUN_KEYS}


def finished_run(cfg, out_dir: Path) -> dict | None:
    """The summary of a run already finished in `out_dir` with this very config (under
    `resume=auto` only: a plain rerun trains again), else None."""
    out_dir = Path(out_dir)
    if str(cfg.get("resume", "never")) != "auto":
        return None
    summary_file, config_file = out_dir / "summary.json", out_dir / "resolved_config.yaml"
    if not (summary_file.exists() and config_file.exists() and (out_dir / "drafter").is_dir()):
        return None
    summary = json.loads(summary_file.read_text())
    if summary.get("preempted"):
        return None
    stored = OmegaConf.to_container(OmegaConf.load(config_file), resolve=True)
    now = OmegaConf.to_container(cfg, resolve=True)
    if _comparable(stored) != _comparable(now):
        log.info("%s holds a finished run of another config: not reused", out_dir)
        return None
    return summary


def continue_command(module: str, argv: list[str], dir_key: str, run_dir: str | Path) -> str:
    """The user's command pinned to its dir (`dir_key`: hydra.run.dir or hydra.sweep.dir)
    with resume=auto, replacing either key where the command set it."""
    keep = [a for a in argv if not a.lstrip("+~").startswith((f"{dir_key}=", "resume="))]
    return shlex.join(["python", "-m", module, *keep, f"{dir_key}={run_dir}", "resume=auto"])


def stop_line(signame: str, where: str, what: str, command: str, sweep: bool) -> str:
    """The one line a stopped run prints: what happened, and how to go on."""
    stops = " The sweep stops here (no comparison yet)." if sweep else ""
    return f"dflash: {signame} in {where}: {what}.{stops} To go on: {command}"
