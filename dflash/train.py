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

from dflash import config
from dflash.errors import hydra_dirs_checked, user_errors_exit
from dflash.preemption import Preempted, StopSignals
from dflash.run.dir import to_log_file
from dflash.run_summary import RunSummary
from dflash.run.stop import after_run, before_start, stopped_before_start
from dflash.topology import launch_rank
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
    s = RunSummary.from_json(summary)
    rows = []
    for k in SHOWN:
        v = getattr(s, k)
        rows.append(f"{k:>26}  {v:,.3f}" if isinstance(v, float) else f"{k:>26}  {v}")
    if s.acceptance:
        from dflash.eval.teacher_forced import format_gap
        rows.append(format_gap(s.acceptance))
    calibration = ((s.eval or {}).get("after") or {}).get("calibration")
    if calibration:
        from dflash.eval.calibration import format_calibration
        rows.append(format_calibration(calibration))
    if s.warmup:
        from dflash.warmup.shapes import format_shape_report
        rows.append(format_shape_report(s.warmup))
    return "\n".join(rows)


@hydra_dirs_checked
@hydra.main(config_path="conf", config_name="train", version_base="1.3")
@user_errors_exit
def _main(cfg: DictConfig) -> float | None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    cpu_notice(cfg.topology)
    done = before_start(cfg, out_dir)  # another run's dir refused; a finished one reused
    if done is not None:
        return done.get("acceptance_length")
    try:
        trainer = Trainer(cfg, out_dir).build()
        summary = trainer.run()
    except Preempted as stop:
        stopped_before_start(cfg, "dflash.train", sys.argv[1:], stop.signame, out_dir)
        return None
    if trainer.topo.is_main:
        text = f"{format_summary(summary)}\nrun dir: {out_dir}"
        if not summary["preempted"]:
            text += f"\ndrafter: {out_dir / 'drafter'}"
        print(text)
        to_log_file(text)
    after_run(summary, "dflash.train", sys.argv[1:], out_dir, trainer.topo.is_main)
    # a sweeper that optimises (Optuna) reads the job's return value
    return summary.get("acceptance_length")


def cpu_notice(topology) -> None:
    """The first line where a GPU is visible and the run stays on the CPU (the CPU
    demo's default topology): what to add to use it."""
    import torch
    if str(topology.device) == "cpu" and torch.cuda.is_available() and launch_rank() == 0:
        print(f"dflash: training on CPU (topology={topology.name}) although "
              f"{torch.cuda.device_count()} GPU(s) are visible: add topology=single_gpu "
              "(or topology=pairs under torchrun) to use them", file=sys.stderr, flush=True)


def main() -> float | None:
    """The app: stop signals are handled from its first line (see dflash.preemption)."""
    with StopSignals():
        try:
            return _main()
        except Preempted as stop:  # before the config was even composed
            if launch_rank() == 0:
                print(f"dflash: {stop.signame} before the run began: nothing to save",
                      file=sys.stderr, flush=True)
            return None


if __name__ == "__main__":
    main()
