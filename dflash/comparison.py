"""Which shuffle strategy should I use? The answer of one `--multirun`, side by side.

When a sweep ends, `ComparisonCallback` (a Hydra callback, see
`conf/experiment/compare_shuffles.yaml`) reads every job's `summary.json` in the sweep
dir and writes there:

    comparison.json   one row per job: strategy, padding efficiency, real tokens/s, pair
                      repeat rate, length mixing, final loss, acceptance length, and the
                      acceptance each run had reached at the same wall time
    comparison.md     the same table, readable
    comparison.png    left: padding efficiency against length mixing, Pareto front
                      marked; right: acceptance length against training wall time

and, when the sweep logs to W&B, the same table as a W&B run of the sweep's group.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

log = logging.getLogger("dflash.comparison")

COLUMNS = ("run", "strategy", "padding_efficiency", "tokens_per_second", "pair_repeat_rate",
           "length_mixing", "final_loss", "acceptance_length", "acceptance_at_equal_time",
           "train_seconds", "real_tokens")


def _curve(s: dict) -> tuple[np.ndarray, np.ndarray]:
    """(training seconds, acceptance length) of a run, from its start to its end."""
    pts = [(0.0, s.get("initial_acceptance_length"))]
    pts += [(p["train_seconds"], p["acceptance_length"]) for p in s.get("eval_curve", [])]
    pts.append((s.get("train_seconds", 0.0), s.get("acceptance_length")))
    pts = sorted((t, a) for t, a in pts if a is not None)
    return np.asarray([p[0] for p in pts]), np.asarray([p[1] for p in pts])


def rows_from_summaries(summaries: list[tuple[str, dict]]) -> list[dict]:
    """One row per run; acceptance compared at the wall time every run reached."""
    if not summaries:
        return []
    t_equal = min(s.get("train_seconds", 0.0) for _, s in summaries)
    rows = []
    for name, s in summaries:
        t, a = _curve(s)
        at = float(np.interp(t_equal, t, a)) if len(t) else None
        rows.append({"run": name, "strategy": s.get("strategy"),
                     "padding_efficiency": s.get("padding_efficiency"),
                     "tokens_per_second": s.get("tokens_per_second"),
                     "pair_repeat_rate": s.get("pair_repeat_rate"),
                     "length_mixing": s.get("length_mixing"),
                     "final_loss": s.get("final_loss"),
                     "acceptance_length": s.get("acceptance_length"),
                     "acceptance_at_equal_time": at, "equal_time_seconds": t_equal,
                     "train_seconds": s.get("train_seconds"), "real_tokens": s.get("real_tokens"),
                     "curve": [[float(x), float(y)] for x, y in zip(t, a)]})
    return rows


def pareto(rows: list[dict]) -> list[int]:
    """Indices of runs no other run beats on both padding efficiency and length mixing."""
    pts = [(r["padding_efficiency"] or 0.0, r["length_mixing"] or 0.0) for r in rows]
    return [i for i, (e, m) in enumerate(pts)
            if not any(e2 >= e and m2 >= m and (e2, m2) != (e, m) for e2, m2 in pts)]


def format_markdown(rows: list[dict]) -> str:
    if not rows:
        return "no runs\n"
    t = rows[0]["equal_time_seconds"]
    head = ["run", "strategy", "pad eff", "real tok/s", "pair repeat", "len mixing",
            "final loss", "accept len", f"accept @ {t:.0f}s"]
    keys = ["run", "strategy", "padding_efficiency", "tokens_per_second", "pair_repeat_rate",
            "length_mixing", "final_loss", "acceptance_length", "acceptance_at_equal_time"]
    fmt = {"tokens_per_second": "{:,.0f}"}

    def cell(k, v):
        if v is None:
            return "-"
        return fmt.get(k, "{:.3f}").format(v) if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(cell(k, r[k]) for k in keys) + " |" for r in rows]
    best = max(rows, key=lambda r: r["acceptance_at_equal_time"] or 0.0)
    lines += ["", f"Highest acceptance at equal wall time ({t:.0f} s of training): "
                  f"**{best['run']}** ({best['acceptance_at_equal_time']:.2f})."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    from dflash.plotting import pyplot, save
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.8))
    front = set(pareto(rows))
    for i, r in enumerate(rows):
        x, y = r["length_mixing"] or 0.0, r["padding_efficiency"] or 0.0
        ax.scatter([x], [y], s=60, marker="*" if i in front else "o", zorder=3)
        ax.annotate(r["run"], (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
        c = np.asarray(r["curve"])
        if len(c):
            bx.plot(c[:, 0], c[:, 1], marker=".", label=r["run"])
    pf = sorted((rows[i]["length_mixing"] or 0.0, rows[i]["padding_efficiency"] or 0.0) for i in front)
    if pf:
        ax.plot([p[0] for p in pf], [p[1] for p in pf], "k--", lw=1, label="Pareto front")
        ax.legend(fontsize=8)
    ax.set(xlabel="length mixing (within-batch length spread)", ylabel="padding efficiency",
           title="throughput vs diversity")
    if rows:
        bx.axvline(rows[0]["equal_time_seconds"], color="gray", ls=":", lw=1)
    bx.set(xlabel="training wall time (s)", ylabel="acceptance length", title="quality over time")
    bx.legend(fontsize=7)
    save(fig, path)


def job_summaries(sweep_dir: Path) -> list[tuple[str, dict]]:
    """(label, summary) of every finished job under the sweep dir, in job order; a
    label is the overrides that differ between the jobs (what the sweep varied)."""
    paths = sorted(Path(sweep_dir).glob("*/summary.json"), key=lambda p: _job_num(p.parent.name))
    sums = [json.loads(p.read_text()) for p in paths]
    split = [dict(o.split("=", 1) for o in s.get("overrides", []) if "=" in o) for s in sums]
    keys = sorted({k for d in split for k in d})
    varied = [k for k in keys if len({d.get(k) for d in split}) > 1]
    out = []
    for p, s, d in zip(paths, sums, split):
        label = ",".join(f"{k}={d[k]}" for k in varied if k in d)
        out.append((label or s.get("run_name") or p.parent.name, s))
    return out


def _job_num(name: str) -> int:
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else 1 << 30


def write_comparison(sweep_dir: Path) -> list[dict]:
    sweep_dir = Path(sweep_dir)
    rows = rows_from_summaries(job_summaries(sweep_dir))
    (sweep_dir / "comparison.json").write_text(json.dumps(rows, indent=2))
    (sweep_dir / "comparison.md").write_text(format_markdown(rows))
    if rows:
        plot(rows, sweep_dir / "comparison.png")
    return rows


def log_to_wandb(rows: list[dict], project: str, group: str, mode: str, out_dir: Path) -> None:
    import wandb
    run = wandb.init(project=project, group=group, name=f"{group}-comparison", mode=mode,
                     dir=str(out_dir), job_type="comparison", reinit="finish_previous")
    try:
        cols = [c for c in COLUMNS]
        run.log({"comparison/table": wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows]),
                 "comparison/plot": wandb.Image(str(out_dir / "comparison.png"))})
    finally:
        run.finish()


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra < 1.1
    Callback = object


class ComparisonCallback(Callback):
    """Writes the comparison files into the sweep dir when a multirun ends."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep = Path(config.hydra.sweep.dir)
        if not list(sweep.glob("*/summary.json")):  # a plan multirun: nothing trained
            log.info("no training summaries in %s: no comparison written", sweep)
            return
        rows = write_comparison(sweep)
        log.info("comparison of %d runs: %s", len(rows), sweep / "comparison.md")
        lg = config.get("logger", {})
        if rows and lg.get("name") == "wandb" and str(lg.get("mode")) != "disabled":
            log_to_wandb(rows, lg.get("project", "dflash"), sweep.name, str(lg.get("mode")), sweep)
