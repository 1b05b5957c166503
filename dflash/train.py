"""`python -m dflash.train [group=option] [key=value ...]`: the main job.

Composes the config, builds the run (data, plans, frozen target, drafter, optimizer,
logger) and trains; writes summary.json, metrics.jsonl, the resolved config and the
final drafter (public DFlash layout) into the Hydra run dir.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from dflash import config, resume_identity
from dflash.errors import user_errors_exit
from dflash.preemption import Preempted, StopSignals, requeue_job, signal_received
from dflash.rerun import continue_command, finished_run, stop_line
from dflash.trainer import Trainer

config.register()  # the schemas every app composes against

log = logging.getLogger("dflash.train")

SHOWN = ("strategy", "steps", "samples_seen", "tokens_per_second", "padding_efficiency",
         "initial_loss", "final_loss", "initial_acceptance_length", "acceptance_length",
         "compiles_after_warmup", "wall_seconds")


def build_trainer(overrides=(), out_dir: str | Path = "outputs/runs/api") -> Trainer:
    """A built run from command-line style overrides, outside Hydra's run dir handling."""
    return Trainer(config.compose("train", overrides), out_dir).build()


def format_summary(summary: dict) -> str:
    rows = []
    for k in SHOWN:
        v = summary.get(k)
        rows.append(f"{k:>26}  {v:,.3f}" if isinstance(v, float) else f"{k:>26}  {v}")
    if summary.get("acceptance"):
        from dflash.eval.teacher_forced import format_gap
        rows.append(format_gap(summary["acceptance"]))
    calibration = ((summary.get("eval") or {}).get("after") or {}).get("calibration")
    if calibration:
        from dflash.eval.calibration import format_calibration
        rows.append(format_calibration(calibration))
    if summary.get("warmup"):
        from dflash.warmup.shapes import format_shape_report
        rows.append(format_shape_report(summary["warmup"]))
    return "\n".join(rows)


def to_log_file(text: str) -> None:
    """The printed summary into the run's log file (Hydra's `train.log`, which holds the
    run's logged warnings and notes) too, without printing it twice on the console."""
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler) and h.stream is not None:
            h.acquire()
            try:
                h.stream.write(text + "\n")
                h.flush()
            finally:
                h.release()


def _stopped(signame: str, out_dir: Path, what: str, main_rank: bool) -> None:
    """One line saying a stop signal ended this run (or sweep) and the command that goes
    on; a sweep ends here, so no later job starts inside the grace period."""
    hc, sweep = HydraConfig.get(), _in_sweep()
    key, where = ("hydra.sweep.dir", hc.sweep.dir) if sweep else ("hydra.run.dir", out_dir)
    if main_rank:
        command = continue_command("dflash.train", sys.argv[1:], key, where)
        print(stop_line(signame, f"job {hc.job.num} ({out_dir})" if sweep else str(out_dir),
                        what, command, sweep), file=sys.stderr, flush=True)
    if sweep:
        raise SystemExit(0)


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
@user_errors_exit
def _main(cfg: DictConfig) -> float | None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    cpu_notice(cfg.topology)
    resume_identity.check_run_dir(cfg, out_dir)  # another run's dir: refused before any work
    done = finished_run(cfg, out_dir)
    if done is not None:  # a rerun of a stopped sweep: this job had finished
        print(f"{out_dir}: finished with this config before; reused", flush=True)
        return done.get("acceptance_length")
    try:
        trainer = Trainer(cfg, out_dir).build()
        summary = trainer.run()
    except Preempted as stop:
        if _main_rank():  # one request for the job, as after a checkpoint
            requeue_job(str(cfg.checkpoint.requeue))
        _stopped(stop.signame, out_dir, "stopped before training began, nothing to save",
                 _main_rank())
        return None
    if trainer.topo.is_main:
        text = f"{format_summary(summary)}\nrun dir: {out_dir}"
        if not summary["preempted"]:
            text += f"\ndrafter: {out_dir / 'drafter'}"
        print(text)
        to_log_file(text)
    if summary["preempted"]:
        _stopped(summary["preempted"], out_dir,
                 f"checkpointed at step {summary['steps']}", trainer.topo.is_main)
    elif signal_received() and _in_sweep():  # after the last step: later jobs wait
        _stopped(signal_received(), out_dir, "finished", trainer.topo.is_main)
    # a sweeper that optimises (Optuna) reads the job's return value
    return summary.get("acceptance_length")


def cpu_notice(topology) -> None:
    """The first line where a GPU is visible and the run stays on the CPU (the CPU
    demo's default topology): what to add to use it."""
    import torch
    if str(topology.device) == "cpu" and torch.cuda.is_available() and _main_rank():
        print(f"dflash: training on CPU (topology={topology.name}) although "
              f"{torch.cuda.device_count()} GPU(s) are visible: add topology=single_gpu "
              "(or topology=pairs under torchrun) to use them", file=sys.stderr, flush=True)


def _in_sweep() -> bool:
    return str(HydraConfig.get().mode) == "RunMode.MULTIRUN"


def _main_rank() -> bool:
    import os
    return os.environ.get("RANK", "0") == "0"


def main() -> float | None:
    """The app: stop signals are handled from its first line (see dflash.preemption)."""
    with StopSignals():
        try:
            return _main()
        except Preempted as stop:  # before the config was even composed
            if _main_rank():
                print(f"dflash: {stop.signame} before the run began: nothing to save",
                      file=sys.stderr, flush=True)
            return None


if __name__ == "__main__":
    main()
