"""comparison.md and comparison.png: intervals over seeds, verdicts, seed spread."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from dflash.comparison.table import JUDGED

_NAMES = {"acceptance_length": "acceptance at equal real tokens",
          "acceptance_at_equal_time": "acceptance at equal wall time",
          "time_to_target": "wall time to the target acceptance",
          "tokens_per_second": "real tokens/s"}


def _ci(v: dict, fmt: str = "{:.2f}") -> str:
    if v["mean"] is None:
        return "-"
    if v["lo"] is None:
        return fmt.format(v["mean"])
    return f"{fmt.format(v['mean'])} ({fmt.format(v['lo'])}–{fmt.format(v['hi'])})"


def format_markdown(rows: list[dict], groups: list[dict], noise: float | None) -> str:
    if not rows:
        return "no runs\n"
    t, target = rows[0]["equal_time_seconds"], rows[0]["target_acceptance"]
    lines = [f"Means over seeds with 95% t-intervals (paired seeds: the same drafter init and "
             f"eval prompts for every strategy). Every job trained on the same real-token "
             f"budget; equal wall time = {t:.0f} s of training (the shortest job); target "
             f"acceptance = {target:.2f}." if target is not None else "",
             f"Eval noise: bootstrap over prompts, median 95% half-width "
             f"±{noise:.3f} per job." if noise is not None else "", ""]
    head = ["strategy", "seeds", "accept @ equal tokens", f"accept @ {t:.0f} s",
            "s to target", "steps to target", "real tok/s", "pad eff", "pair repeat",
            "len mixing"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for g in groups:
        n = len(g["seeds"])
        reach = f" [{g['reached_target']}/{n}]" if g["reached_target"] < n else ""
        lines.append("| " + " | ".join([
            g["group"], str(n), _ci(g["acceptance_length"]), _ci(g["acceptance_at_equal_time"]),
            _ci(g["time_to_target"], "{:.0f}") + reach, _ci(g["steps_to_target"], "{:.0f}"),
            _ci(g["tokens_per_second"], "{:,.0f}"), _ci(g["padding_efficiency"], "{:.3f}"),
            _ci(g["pair_repeat_rate"], "{:.3f}"), _ci(g["length_mixing"], "{:.3f}")]) + " |")
    lines += ["", "Verdicts, each strategy against the best (a difference is named only when "
              "its paired 95% interval excludes zero):", ""]
    for metric, _, _ in JUDGED:
        best = next((g for g in groups if g.get("verdicts", {}).get(metric, {}).get("verdict")
                     == "best"), None)
        if best is None:
            continue
        lines.append(f"- **{_NAMES[metric]}**: best mean {best['group']}")
        for g in groups:
            if g is not best:
                lines.append(f"  - {best['group']} vs {g['group']}: {g['verdicts'][metric]['verdict']}")
    lines += ["", "Per job (train s: measured, and predicted by the step cost file when the "
              "sweep ran with cost=FILE):", "",
              "| run | seed | accept (eval 95% CI) | s to target | real tokens | steps | train s "
              "(predicted) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        b = r["acceptance_bootstrap"]
        acc = f"{r['acceptance_length']:.2f}" if r["acceptance_length"] is not None else "-"
        if b:
            acc += f" ({b['lo']:.2f}–{b['hi']:.2f})"
        tt = f"{r['time_to_target']:.0f}" if r["time_to_target"] is not None else "not reached"
        secs = f"{r['train_seconds']:.1f}" if r.get("train_seconds") is not None else "-"
        if r.get("predicted_train_seconds") is not None:
            secs += f" ({r['predicted_train_seconds']:.1f})"
        lines.append(f"| {r['run']} | {r['seed']} | {acc} | {tt} | {r['real_tokens']:,} | "
                     f"{r['steps']} | {secs} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], groups: list[dict], path: Path) -> None:
    """Left: efficiency against length mixing (mean, interval bars over seeds). Right:
    acceptance against training time, the mean over seeds with the seeds' spread as a
    band; dashed: the target acceptance, dotted: equal wall time."""
    from dflash.plotting import pyplot, save
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12.5, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, g in enumerate(groups):
        col = colors[i % len(colors)]
        x, y = g["length_mixing"], g["padding_efficiency"]
        if x["mean"] is not None and y["mean"] is not None:
            err = lambda v: None if v["lo"] is None else [[v["mean"] - v["lo"]], [v["hi"] - v["mean"]]]  # noqa: E731
            ax.errorbar([x["mean"]], [y["mean"]], xerr=err(x), yerr=err(y), fmt="o", color=col,
                        capsize=3)
            ax.annotate(g["group"], (x["mean"], y["mean"]), textcoords="offset points",
                        xytext=(5, 4), fontsize=8)
        curves = [np.asarray(r["curve"]) for r in rows if r["group"] == g["group"] and r["curve"]]
        if not curves:
            continue
        end = min(c[-1, 0] for c in curves)
        grid = np.linspace(0.0, end, 60)
        ys = np.stack([np.interp(grid, c[:, 0], c[:, 3]) for c in curves])
        bx.plot(grid, ys.mean(0), color=col, label=f"{g['group']} ({len(curves)} seeds)")
        bx.fill_between(grid, ys.min(0), ys.max(0), color=col, alpha=0.18, lw=0)
    ax.set(xlabel="length mixing (within-batch length spread)", ylabel="padding efficiency",
           title="throughput vs diversity (mean, 95% CI over seeds)")
    if rows:
        bx.axvline(rows[0]["equal_time_seconds"], color="gray", ls=":", lw=1)
        if rows[0]["target_acceptance"] is not None:
            bx.axhline(rows[0]["target_acceptance"], color="gray", ls="--", lw=1)
    bx.set(xlabel="training wall time (s)", ylabel="acceptance length",
           title="quality over time (mean; band: seed spread)")
    bx.legend(fontsize=7)
    save(fig, path)
