"""One Logger interface for the trainer: metrics.jsonl always, plus W&B when chosen.

Only rank 0 writes. `log()` receives host-side floats (the trainer synchronises device
metrics every `logger.log_every` steps), so logging never stalls the device. Besides
the step records: `log_plan()` once at the start (per-bucket table, lengths, bucket
boundaries, warmup shapes) and `log_eval()` for every acceptance measurement.

W&B runs offline by default (no account needed); the run's config is the fully
resolved Hydra config, its name and group come from the Hydra job (a multirun's jobs
share the sweep's group). Metrics are namespaced:

    train/  loss, lr, grad norm, per-position accuracy, teacher-forced accept estimate
    perf/   real and padded tokens/s, padding efficiency, stage timings, bottleneck
    eval/   acceptance length by real speculative decoding, per-position acceptance
    plan/   per-bucket table, length histogram with the bucket boundaries drawn,
            pair repeat rate, length mixing, warmup shapes; compile counts at the end

each with `define_metric` step axes (train/perf on the step, eval on its own step).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from dflash.errors import ConfigError, one_line, require
from dflash.options import choice, options


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


_TRAIN = {"loss", "lr", "grad_norm", "acc", "accept_est"}


def _namespace(key: str) -> str:
    return "train" if key in _TRAIN else "perf"


class WandbLogger(Logger):
    def __init__(self, cfg, out_dir: Path, resolved_config: dict, run_name=None, group=None,
                 resuming: bool = False):
        import wandb

        self.wandb = wandb
        # a run resumed in its dir goes on in the W&B run it started (its id is kept there)
        id_file = Path(out_dir) / "wandb_run_id"
        run_id = id_file.read_text().strip() if resuming and id_file.exists() else None
        try:
            self.run = wandb.init(project=cfg.project, mode=choice(cfg.mode), dir=str(out_dir),
                                  config=resolved_config, group=group or cfg.get("group"),
                                  name=run_name or cfg.get("run_name"), reinit="finish_previous",
                                  id=run_id, resume="allow" if run_id else None)
        except Exception as exc:  # noqa: BLE001  (no key, no network, a bad WANDB_* setting)
            raise wandb_refused(cfg, exc) from None
        id_file.write_text(self.run.id)
        self.run.define_metric("step")
        for ns in ("train", "perf", "plan"):
            self.run.define_metric(f"{ns}/*", step_metric="step")
        self.run.define_metric("eval/step")
        self.run.define_metric("eval/*", step_metric="eval/step")

    def log(self, record: dict, step: int) -> None:
        flat = {"step": step}
        for k, v in record.items():
            ns = _namespace(k)
            if isinstance(v, list):
                flat.update({f"{ns}/{k}_{i + 1}": x for i, x in enumerate(v)})
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                flat[f"{ns}/{k}"] = v
        if "bottleneck" in record:
            flat["perf/target_is_bottleneck"] = int(record["bottleneck"] == "target")
        self.run.log(flat)

    def log_eval(self, record: dict, step: int) -> None:
        if not record:
            return
        flat = {"eval/step": step, "eval/acceptance_length": record.get("acceptance_length")}
        hist = np.asarray(record.get("histogram") or [], dtype=np.float64)
        if hist.sum() > 0:  # per position k: the share of verify steps accepting >= k tokens
            tail = np.cumsum(hist[::-1])[::-1] / hist.sum()
            flat.update({f"eval/accept_ge_{k}": float(tail[k - 1]) for k in range(2, len(tail) + 1)})
        self.run.log({k: v for k, v in flat.items() if v is not None})

    def log_plan(self, info: dict) -> None:
        wb = self.wandb
        rows = info.get("buckets", [])
        cols = ["lo", "hi", "samples", "batches", "mean_batch_size", "efficiency"]
        out = {"plan/buckets": wb.Table(columns=cols, data=[[r[c] for c in cols] for r in rows])}
        for k in ("pair_repeat_rate", "length_mixing", "steps_per_epoch", "total_steps"):
            if k in info:
                self.run.summary[f"plan/{k}"] = info[k]
        shapes = info.get("shapes", {})
        if shapes:
            out["plan/warmup_shapes"] = wb.Table(columns=["batch", "length", "anchors"],
                                                 data=shapes.get("warm_shapes", []))
            self.run.summary["plan/warmup_steps_covered"] = shapes.get("steps_covered")
        if info.get("lengths") is not None:
            from dflash.plotting import pyplot
            fig = _histogram(np.asarray(info["lengths"]), info.get("boundaries", []))
            out["plan/length_histogram"] = wb.Image(fig)
            pyplot().close(fig)
        self.run.log(out)

    def summary(self, summary: dict) -> None:
        for k, v in summary.items():
            if isinstance(v, (int, float, str)) and not isinstance(v, bool):
                self.run.summary[k] = v
        self.run.summary["plan/compiles_after_warmup"] = summary.get("compiles_after_warmup")
        gap = summary.get("acceptance") or {}
        for k in ("train_teacher_forced", "heldout_teacher_forced", "heldout_decode_path",
                  "heldout_decoded"):
            if gap.get(k) is not None:
                self.run.summary[f"acceptance/{k}"] = gap[k]
        rows = list(zip(gap.get("heldout_teacher_forced_per_position") or [],
                        gap.get("heldout_decode_path_per_position") or [],
                        gap.get("heldout_decoded_per_position") or []))
        if rows:  # one table: position k, P(>= k accepted) teacher-forced and decoded
            self.run.log({"acceptance/per_position": self.wandb.Table(
                columns=["k", "heldout_teacher_forced", "heldout_decode_path", "heldout_decoded"],
                data=[[k + 1, *r] for k, r in enumerate(rows)])})
        if gap.get("warning"):
            self.run.summary["acceptance/warning"] = gap["warning"]

    def finish(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def _histogram(lengths: np.ndarray, boundaries):
    """A matplotlib figure: sample lengths with the bucket boundaries as vertical lines."""
    from dflash.plotting import pyplot
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.hist(lengths, bins=80, color="tab:blue", alpha=0.8)
    for b in boundaries:
        ax.axvline(b, color="tab:red", lw=1, ls="--")
    ax.set(xlabel="sample length (tokens)", ylabel="samples", title="lengths and bucket boundaries")
    fig.tight_layout()
    return fig


NO_KEY = ("run `wandb login` or set WANDB_API_KEY, or use logger.mode=offline and `wandb "
          "sync` later")


def wandb_refused(cfg, exc: Exception) -> ConfigError:
    said = f"{type(exc).__name__}: {one_line(exc, 200)}"
    fix = f"; {NO_KEY}" if "API key" in said else ""
    return ConfigError(f"logger=wandb logger.mode={choice(cfg.mode)}: W&B could not start a "
                       f"run ({said}){fix}")


def check_wandb_login(cfg) -> None:
    """logger=wandb online: W&B's credentials are looked up at start (found, not verified
    with the server), so a job without them stops before its target loads, not when its
    first record is due.
    Training checks this on rank 0; preflight does not (it runs where the job is planned,
    often not where it runs)."""
    if cfg.name != "wandb" or choice(cfg.mode) != "online":
        return
    import sys
    import wandb
    try:  # False (no prompt) or UsageError: no key found
        found = wandb.login(verify=False, prompt=bool(sys.stdin and sys.stdin.isatty()))
    except Exception as exc:  # noqa: BLE001
        raise wandb_refused(cfg, exc) from None
    if not found:
        raise ConfigError(f"logger=wandb logger.mode=online: no W&B API key here; {NO_KEY}")


def build_logger(cfg, out_dir: Path, resolved_config: dict, rank: int = 0,
                 run_name: str | None = None, group: str | None = None,
                 resuming: bool = False) -> Logger:
    if rank != 0:
        return Logger()
    loggers = [JsonlLogger(out_dir / "metrics.jsonl")]
    if cfg.name == "wandb":
        loggers.append(WandbLogger(cfg, out_dir, resolved_config, run_name, group, resuming))
    return MultiLogger(loggers)


# ---- its config section (registered with Hydra by dflash.config) ----

LoggerMode = options("LoggerMode", ("online", "offline", "disabled"))


def check_logger(cfg) -> None:
    """`logger.log_every` is the host sync's period: 0 or less never syncs."""
    require(int(cfg.log_every) >= 1, "logger.log_every", cfg.log_every, ">= 1")


@dataclass
class LoggerConfig:
    name: str = "none"  # none | wandb (metrics.jsonl is always written)
    project: str = "dflash"  # W&B project
    mode: LoggerMode = LoggerMode.disabled  # W&B mode: online | offline | disabled
    log_every: int = 10  # steps between metric syncs to the host
    progress: bool = True  # the tqdm bar
    group: Optional[str] = None  # W&B group (a multirun's sweep)
    # the gradient norm costs a reduction over every parameter when grad clipping is off
    grad_norm: bool = True
    run_name: Optional[str] = None  # W&B run name (null: from the overrides)
