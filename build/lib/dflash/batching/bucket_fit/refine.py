"""Polish optimal boundaries against the exact simulation of the real planner.

The dynamic program is exact for its model (random order inside a bucket, lengths
represented by histogram bins), but the model does not see `batching.sort_window`
(sorted windows pack far tighter), and in heavy tails a wide bin's mean understates the
maxima batches really pad to. So the DP answer is the starting point of a coordinate
search whose objective is `simulate` itself, on a grid of candidate edges several times
finer than the cost table's: each inner boundary in turn moves to the best of a few
neighbouring grid edges while that raises the simulated efficiency. The figure it ends
with is the one the planner will reach, and the one a preset reports.
"""
from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from dflash.batching.bucket_fit.cost import histogram_bins
from dflash.batching.bucket_fit.optimal import simulate
from dflash.batching.strategies import PackingSpec

STEPS = (-4, -1, 1, 4)  # grid moves tried per boundary


def refine_by_simulation(lengths, boundaries, spec: PackingSpec, quadratic: float = 0.0,
                         grid_bins: int = 1024, max_passes: int = 4, seed: int = 0,
                         progress: bool = False) -> tuple[np.ndarray, float, int]:
    """(boundaries, simulated efficiency over one epoch, simulations run)."""
    b = np.asarray(boundaries, dtype=np.int64).copy()
    grid = np.unique(np.concatenate([histogram_bins(np.asarray(lengths), grid_bins)[0], b]))
    pos = np.searchsorted(grid, b)
    score = lambda idx: simulate(lengths, grid[idx], spec, 1, seed, quadratic)["efficiency"]  # noqa: E731
    best, runs = score(pos), 1
    bar = tqdm(total=max_passes * (len(b) - 2), desc="refine (simulated)", disable=not progress)
    for _ in range(max_passes):
        moved = False
        for i in range(1, len(b) - 1):
            bar.update()
            trials = [p for p in pos[i] + np.asarray(STEPS) if pos[i - 1] < p < pos[i + 1]]
            for p in trials:
                cand = pos.copy()
                cand[i] = p
                eff = score(cand)
                runs += 1
                if eff > best + 1e-9:
                    best, pos, moved = eff, cand, True
        if not moved:
            break
    bar.close()
    return grid[pos], best, runs
