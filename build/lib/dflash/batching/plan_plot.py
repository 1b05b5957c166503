"""PNG of plan reports: the efficiency / batch-diversity trade-off, one point per run."""
from __future__ import annotations

from pathlib import Path

from dflash.plotting import pyplot, save


def label(entry: dict) -> str:
    window = entry.get("sort_window") or 0
    if entry["strategy"] == "bucketed":
        extra = f", window {window}" if window else ""
        return f"bucketed ({entry.get('buckets_preset', '?')}{extra})"
    if entry["strategy"] == "megabatch":
        return f"megabatch (window {window})"
    return entry["strategy"]


def plot_tradeoff(entries: list[dict], path: str | Path) -> Path:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for i, e in enumerate(sorted(entries, key=lambda e: e["length_mixing"])):
        ax.scatter(e["length_mixing"], e["padding_efficiency"], s=60 + 400 * e["pair_repeat_rate"])
        # alternate above/below so neighbouring labels do not overprint
        ax.annotate(label(e), (e["length_mixing"], e["padding_efficiency"]),
                    textcoords="offset points", xytext=(8, 8 if i % 2 else -14), fontsize=9)
    ax.set_xlabel("length mixing (within-batch length std / overall std)")
    ax.set_ylabel("padding efficiency (useful / padded tokens)")
    ax.set_xlim(-0.05, 1.1)
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.set_title("batching trade-off (marker size: pair repeat rate across epochs)")
    return save(fig, path)
