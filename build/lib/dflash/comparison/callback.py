"""The comparison files of a training sweep, written when the multirun ends."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from dflash.comparison.report import format_markdown, plot
from dflash.comparison.table import eval_noise, group_rows, job_rows, job_summaries

log = logging.getLogger("dflash.comparison")

COLUMNS = ("run", "seed", "strategy", "padding_efficiency", "tokens_per_second",
           "pair_repeat_rate", "length_mixing", "final_loss", "acceptance_length",
           "acceptance_at_equal_time", "time_to_target", "train_seconds",
           "predicted_train_seconds", "real_tokens")


def write_comparison(sweep_dir: Path, target: float | None = None) -> list[dict]:
    """comparison.json (one row per job; each carries its strategy's intervals over seeds
    and verdicts), comparison.md and comparison.png in the sweep dir."""
    sweep_dir = Path(sweep_dir)
    rows = job_rows(job_summaries(sweep_dir), target)
    groups = group_rows(rows)
    by_group = {g["group"]: g for g in groups}
    for r in rows:
        g = by_group[r["group"]]
        r["over_seeds"] = {k: v for k, v in g.items() if isinstance(v, dict) and "mean" in v}
        r["verdicts"] = g.get("verdicts", {})
    (sweep_dir / "comparison.json").write_text(json.dumps(rows, indent=2, default=str))
    (sweep_dir / "comparison.md").write_text(format_markdown(rows, groups, eval_noise(rows)))
    if rows:
        plot(rows, groups, sweep_dir / "comparison.png")
    return rows


def log_to_wandb(rows: list[dict], project: str, group: str, mode: str, out_dir: Path) -> None:
    import wandb
    run = wandb.init(project=project, group=group, name=f"{group}-comparison", mode=mode,
                     dir=str(out_dir), job_type="comparison", reinit="finish_previous")
    try:
        run.log({"comparison/table": wandb.Table(columns=list(COLUMNS),
                                                 data=[[r.get(c) for c in COLUMNS] for r in rows]),
                 "comparison/plot": wandb.Image(str(out_dir / "comparison.png"))})
    finally:
        run.finish()


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra < 1.1
    Callback = object


class ComparisonCallback(Callback):
    """Writes the comparison files into the sweep dir when a multirun ends
    (`compare.target_acceptance`: the target; null: the lowest final acceptance)."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep = Path(config.hydra.sweep.dir)
        if not list(sweep.glob("*/summary.json")):  # a plan multirun: nothing trained
            log.info("no training summaries in %s: no comparison written", sweep)
            return
        target = (config.get("compare") or {}).get("target_acceptance")
        rows = write_comparison(sweep, None if target is None else float(target))
        log.info("comparison of %d runs: %s", len(rows), sweep / "comparison.md")
        lg = config.get("logger", {})
        if rows and lg.get("name") == "wandb" and str(lg.get("mode")) != "disabled":
            log_to_wandb(rows, lg.get("project", "dflash"), sweep.name, str(lg.get("mode")), sweep)
