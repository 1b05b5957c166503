"""W&B backend of the Logger interface (offline by default: no account needed)."""
from __future__ import annotations

from pathlib import Path

from .config import choice
from .loggers import Logger


class WandbLogger(Logger):
    def __init__(self, cfg, out_dir: Path, resolved_config: dict):
        import wandb

        mode = choice(cfg.mode)
        self.run = wandb.init(project=cfg.project, mode=mode, dir=str(out_dir),
                              config=resolved_config, group=cfg.get("group"),
                              name=cfg.get("run_name"), reinit="finish_previous")

    def log(self, record: dict, step: int) -> None:
        flat = {}
        for k, v in record.items():
            if isinstance(v, list):
                flat.update({f"{k}/{i + 1}": x for i, x in enumerate(v)})
            elif isinstance(v, (int, float)):
                flat[k] = v
        self.run.log(flat, step=step)

    def summary(self, summary: dict) -> None:
        for k, v in summary.items():
            if isinstance(v, (int, float, str)):
                self.run.summary[k] = v

    def finish(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)
