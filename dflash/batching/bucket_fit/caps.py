"""Per-bucket batch sizes fitted to a step cost model.

Within the token budget a bucket's batches take up to `max_batch_size` samples. A lower
cap costs more steps, each paying the per-step overhead, but a batch of fewer random
draws has a shorter longest sample, so each row pads less; where a row's cost grows
faster than its length (attention), a wide bucket can come out faster with fewer rows.
The renewal chain of cost.py prices every cap of every bucket in expectation (random
order inside the bucket, the greedy rule); a bucket takes a lower cap only when it is
predicted at least `min_gain` faster, and the caller keeps the caps only when the exact
simulation of the planner agrees (see buckets.fit_to_time).
"""
from __future__ import annotations

import numpy as np

from dflash.batching.bucket_fit.cost import histogram_bins, whole_bucket_cost
from dflash.batching.bucket_fit.optimal import row_seconds


def shuffled_steps(time_model):
    """The cost model of a step whose shape differs from the previous one's: bucketed
    batches run in shuffled order, so nearly every step pays the switch cost too."""
    from dflash.batching.step_cost import CostModel
    if time_model.switch is None:
        return time_model
    return CostModel(time_model.coef + time_model.switch, dict(time_model.bounds))


def fit_bucket_caps(lengths, boundaries, spec, time_model, anchors: int,
                    min_gain: float = 0.005, max_bins: int = 256) -> tuple[np.ndarray, list[dict]]:
    """The fastest cap per bucket (int64 [num_buckets]) and a row per bucket: its cap,
    predicted seconds per sample at that cap and at `max_batch_size`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    boundaries = np.asarray(boundaries, dtype=np.int64)
    model = shuffled_steps(time_model)
    per_batch = float(model.coef[0])
    bucket = np.searchsorted(boundaries, lengths, side="right") - 1
    full = int(spec.max_batch_size)
    caps, rows = [], []
    for j in range(len(boundaries) - 1):
        sub = lengths[bucket == j]
        if not len(sub):
            caps.append(full)
            rows.append({"lo": int(boundaries[j]), "hi": int(boundaries[j + 1]), "cap": full})
            continue
        _, values, counts, _ = histogram_bins(sub, max_bins)
        cv = row_seconds(values, model, anchors)
        # a cap above budget // shortest never binds: no batch can hold more
        top = max(1, min(full, int(spec.token_budget) // max(1, int(sub.min()))))
        cost = {c: whole_bucket_cost(values, counts, spec.token_budget, c, cv, per_batch)
                for c in range(1, top + 1)}
        best = min(cost, key=lambda c: (cost[c], -c))
        cap = best if cost[best] < cost[top] * (1.0 - min_gain) else full
        caps.append(cap)
        rows.append({"lo": int(boundaries[j]), "hi": int(boundaries[j + 1]), "cap": cap,
                     "seconds_per_sample": cost[min(cap, top)],
                     "seconds_per_sample_full_cap": cost[top]})
    return np.asarray(caps, dtype=np.int64), rows
