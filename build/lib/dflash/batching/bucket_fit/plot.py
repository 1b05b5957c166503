"""PNG of a bucket fit: length histogram with the boundaries, per-bucket efficiency."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from dflash.plotting import pyplot, save


def plot_fit(lengths: np.ndarray, boundaries, predicted: list[float], simulated: list[float],
             path: str | Path, title: str = "") -> Path:
    plt = pyplot()

    b = np.asarray(boundaries)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), height_ratios=[3, 2])
    top.hist(lengths, bins=min(200, max(10, len(np.unique(lengths)))), color="#4c72b0")
    for j, (lo, hi) in enumerate(zip(b[:-1], b[1:])):
        if j % 2:
            top.axvspan(lo, hi, color="0.92", zorder=0)
    for x in b:
        top.axvline(x, color="#c44e52", lw=1.2)
    top.set_xlabel("sample length (tokens)")
    top.set_ylabel("samples")
    top.set_title(title or f"{len(b) - 1} buckets")
    x = np.arange(len(b) - 1)
    bottom.bar(x - 0.2, predicted, 0.4, label="predicted", color="#8172b2")
    bottom.bar(x + 0.2, simulated, 0.4, label="simulated", color="#55a868")
    bottom.set_xticks(x, [f"[{lo}, {hi})" for lo, hi in zip(b[:-1], b[1:])], rotation=30,
                      fontsize=8)
    bottom.set_ylim(0, 1)
    bottom.set_ylabel("padding efficiency")
    bottom.legend(loc="lower right")
    return save(fig, path)
