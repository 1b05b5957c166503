"""One Logger interface for the runner: metrics.jsonl always, plus W&B when chosen.

Only rank 0 writes. `log()` receives host-side floats (the runner synchronises device
metrics every `logger.log_every` steps), so logging never stalls the device.
"""
from __future__ import annotations

import json
from pathlib import Path


class Logger:
    def log(self, record: dict, step: int) -> None: ...
    def summary(self, summary: dict) -> None: ...
    def finish(self, failed: bool = False) -> None: ...


class JsonlLogger(Logger):
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", buffering=1)  # line-buffered: a crash keeps lines

    def log(self, record: dict, step: int) -> None:
        self._f.write(json.dumps({"step": step, **record}) + "\n")

    def finish(self, failed: bool = False) -> None:
        self._f.close()


class MultiLogger(Logger):
    def __init__(self, loggers):
        self.loggers = list(loggers)

    def log(self, record, step):
        for lg in self.loggers:
            lg.log(record, step)

    def summary(self, summary):
        for lg in self.loggers:
            lg.summary(summary)

    def finish(self, failed=False):
        for lg in self.loggers:
            lg.finish(failed)


def build_logger(cfg, out_dir: Path, resolved_config: dict, rank: int = 0) -> Logger:
    if rank != 0:
        return Logger()
    loggers = [JsonlLogger(out_dir / "metrics.jsonl")]
    if cfg.name == "wandb":
        from .wandb_logger import WandbLogger
        loggers.append(WandbLogger(cfg, out_dir, resolved_config))
    return MultiLogger(loggers)
