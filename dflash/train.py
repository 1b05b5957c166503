"""`python -m dflash.train [group=option] [key=value ...]`: the main job.

Composes the config, builds the run (data, plans, frozen target, drafter, optimizer,
logger) and trains; writes summary.json, metrics.jsonl, the resolved config and the
final drafter (public DFlash layout) into the Hydra run dir.
"""
from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from dflash import config
from dflash.trainer import Trainer
from dflash.errors import user_errors_exit

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


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
@user_errors_exit
def main(cfg: DictConfig) -> float | None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    trainer = Trainer(cfg, out_dir).build()
    summary = trainer.run()
    if trainer.topo.is_main:
        text = f"{format_summary(summary)}\nrun dir: {out_dir}"
        print(text)
        to_log_file(text)
    # a sweeper that optimises (Optuna) reads the job's return value
    return summary.get("acceptance_length")


if __name__ == "__main__":
    main()
