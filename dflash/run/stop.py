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
import sys
from pathlib import Path

from omegaconf import OmegaConf

log = logging.getLogger("dflash.run.stop")

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


def in_sweep() -> bool:
    """Whether this job is one of a Hydra sweep's (--multirun)."""
    from hydra.core.hydra_config import HydraConfig
    return str(HydraConfig.get().mode) == "RunMode.MULTIRUN"


def stopped(module: str, argv: list[str], signame: str, out_dir: Path, what: str,
            main_rank: bool) -> None:
    """One line saying a stop signal ended this run (or sweep) and the command that goes
    on; a sweep ends here, so no later job starts inside the grace period."""
    from hydra.core.hydra_config import HydraConfig
    hc, sweep = HydraConfig.get(), in_sweep()
    key, where = ("hydra.sweep.dir", hc.sweep.dir) if sweep else ("hydra.run.dir", out_dir)
    if main_rank:
        command = continue_command(module, argv, key, where)
        print(stop_line(signame, f"job {hc.job.num} ({out_dir})" if sweep else str(out_dir),
                        what, command, sweep), file=sys.stderr, flush=True)
    if sweep:
        raise SystemExit(0)


def before_start(cfg, out_dir: Path) -> dict | None:
    """Before any work: another run's dir is refused (its identity differs); a finished
    run of this very config (a rerun of a stopped sweep) is reused - its summary."""
    from dflash.run.identity import check_run_dir
    check_run_dir(cfg, out_dir)
    done = finished_run(cfg, out_dir)
    if done is not None:
        print(f"{out_dir}: finished with this config before; reused", flush=True)
    return done


def stopped_before_start(cfg, module: str, argv: list[str], signame: str, out_dir: Path) -> None:
    """A stop signal while the run was being built: one requeue request for the job (as
    after a checkpoint) and the line that says how to go on."""
    from dflash.preemption import requeue_job
    from dflash.topology import launch_rank
    main_rank = launch_rank() == 0
    if main_rank:
        requeue_job(str(cfg.checkpoint.requeue), signame)
    stopped(module, argv, signame, out_dir, "stopped before training began, nothing to save",
            main_rank)


def after_run(summary: dict, module: str, argv: list[str], out_dir: Path, main_rank: bool) -> None:
    """A preempted run says where it checkpointed and how to go on; a sweep whose job
    finished after a stop signal ends here (later jobs wait for the rerun)."""
    from dflash.preemption import signal_received
    if summary["preempted"]:
        stopped(module, argv, summary["preempted"], out_dir,
                f"checkpointed at step {summary['steps']}", main_rank)
    elif signal_received() and in_sweep():
        stopped(module, argv, signal_received(), out_dir, "finished", main_rank)
