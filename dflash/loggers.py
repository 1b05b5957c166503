"""One Logger interface for the runner: metrics.jsonl always, plus W&B when chosen.

Only rank 0 writes. `log()` receives host-side floats (the runner synchronises device
metrics every `logger.log_every` steps), so logging never stalls the device. Besides
the step records: `log_plan()` once at the start (per-bucket table, lengths, bucket
boundaries, warmup shapes) and `log_eval()` for every acceptance measurement.
"""
from __future__ import annotations

import json
from pathlib import Path


class Logger:
    def log(self, record: dict, step: int) -> None: ...
    def log_plan(self, info: dict) -> None: ...
    def log_eval(self, record: dict, step: int) -> None: ...
    def summary(self, summary: dict) -> None: ...
    def finish(self, failed: bool = False) -> None: ...


class JsonlLogger(Logger):
    """metrics.jsonl (one line per sync) and eval.jsonl (one line per measurement)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", buffering=1)  # line-buffered: a crash keeps lines
        self._eval = self.path.with_name("eval.jsonl")

    def log(self, record: dict, step: int) -> None:
        self._f.write(json.dumps({"step": step, **record}) + "\n")

    def log_eval(self, record: dict, step: int) -> None:
        if record:
            with open(self._eval, "a") as f:
                f.write(json.dumps({"step": step, **record}) + "\n")

    def finish(self, failed: bool = False) -> None:
        self._f.close()


class MultiLogger(Logger):
    def __init__(self, loggers):
        self.loggers = list(loggers)

    def _each(self, method: str, *args) -> None:
        for lg in self.loggers:
            getattr(lg, method)(*args)

    def log(self, record, step):
        self._each("log", record, step)

    def log_plan(self, info):
        self._each("log_plan", info)

    def log_eval(self, record, step):
        self._each("log_eval", record, step)

    def summary(self, summary):
        self._each("summary", summary)

    def finish(self, failed=False):
        errors = []
        for lg in self.loggers:  # every backend finishes, even if one fails to
            try:
                lg.finish(failed)
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
        if errors:
            raise errors[0]


def build_logger(cfg, out_dir: Path, resolved_config: dict, rank: int = 0,
                 run_name: str | None = None, group: str | None = None) -> Logger:
    if rank != 0:
        return Logger()
    loggers = [JsonlLogger(out_dir / "metrics.jsonl")]
    if cfg.name == "wandb":
        from dflash.wandb_logger import WandbLogger
        loggers.append(WandbLogger(cfg, out_dir, resolved_config, run_name, group))
    return MultiLogger(loggers)
