"""Brute-force reference for the bucket optimiser (small inputs only)."""
from __future__ import annotations

import itertools

from dflash.batching.bucket_fit.optimal import BucketFit, CostTable, _check_k, _fit


def exhaustive_fit(table: CostTable, k: int) -> BucketFit:
    """Brute force over every choice of inner boundaries (for tests on small inputs)."""
    _check_k(table, k)
    g = table.num_bins
    best = None
    for inner in itertools.combinations(range(1, g), k - 1):
        cuts = (0, *inner, g)
        cost = sum(table.padded[a, b] for a, b in zip(cuts[:-1], cuts[1:]))
        if best is None or cost < best[0]:
            best = (cost, cuts)
    return _fit(table, best[1])
