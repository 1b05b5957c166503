"""Globally optimal bucket boundaries for dflash's bucketed shuffle.

The expected padded cost of the whole plan is the sum of each bucket's cost, and a
bucket's cost depends only on its own [lo, hi) (cost.py). So with candidate
boundaries at histogram-bin edges, a dynamic program over (buckets used, last edge)
finds the exact optimum over those candidates in O(K * G^2) after an all-pairs cost
table. The answer is then measured by exact simulation of the real planner.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from dflash.batching.bucket_fit.cost import bucket_costs_from, histogram_bins
from dflash.errors import DataError
from dflash.data.lengths import check_fits_budget, check_lengths
from dflash.batching.metrics import bucket_table
from dflash.batching.strategies import PackingSpec, Planner


@dataclass
class CostTable:
    edges: np.ndarray  # int64 [G + 1] candidate boundaries (bin edges)
    counts: np.ndarray  # int64 [G] samples per bin
    useful: np.ndarray  # float64 [G] useful cost per bin (tokens, or with attention term)
    padded: np.ndarray  # float64 [G + 1, G + 1]; padded[a, b] = expected cost of bins [a, b)
    quadratic: float = 0.0

    @property
    def num_bins(self) -> int:
        return len(self.counts)


@dataclass
class BucketFit:
    boundaries: np.ndarray  # int64, first 0, last past the longest sample
    cuts: tuple  # bin-edge indices of the boundaries
    predicted_efficiency: float
    per_bucket_predicted: list = field(default_factory=list)

    @property
    def num_buckets(self) -> int:
        return len(self.boundaries) - 1


def slot_cost(values: np.ndarray, quadratic: float) -> np.ndarray:
    """Cost of one (padded) token slot at length L: L, plus an attention term c * L^2."""
    values = np.asarray(values, dtype=np.float64)
    return values + quadratic * values * values


def row_seconds(values, time_model, anchors: int) -> np.ndarray:
    """Seconds one row of padded length L adds to a step under a step cost model
    (everything but the per-step term)."""
    L = np.asarray(values, dtype=np.float64)
    return time_model.seconds(np.ones_like(L), L, anchors) - time_model.coef[0]


def build_cost_table(lengths, spec: PackingSpec, candidates: int = 256,
                     quadratic: float = 0.0, progress: bool = False,
                     time_model=None, anchors: int = 0) -> CostTable:
    """The all-pairs table of expected bucket costs: padded token slots (optionally with
    an attention term), or with `time_model` (a step cost model) predicted seconds:
    per-step overhead plus each row's cost at the batch's padded length."""
    lengths = check_lengths(lengths)
    check_fits_budget(lengths, spec.token_budget)
    if candidates < 2:
        raise DataError(f"candidates must be >= 2, got {candidates}")
    edges, values, counts, tokens = histogram_bins(lengths, candidates)
    g = len(counts)
    # the cost of one row (or slot) at a padded length, and of every batch
    if time_model is not None:
        row = lambda x: row_seconds(x, time_model, anchors)  # noqa: E731
        per_batch = float(time_model.coef[0])
    else:
        row, per_batch = (lambda x: slot_cost(x, quadratic)), 0.0
    cv = row(values)
    if time_model is not None or quadratic:
        idx = np.searchsorted(edges, lengths, side="right") - 1
        useful = np.bincount(idx, weights=row(lengths), minlength=g)
    else:
        useful = tokens.astype(np.float64)
    padded = np.full((g + 1, g + 1), np.inf)
    for a in tqdm(range(g), desc="bucket costs", disable=not progress):
        per_sample = bucket_costs_from(a, values, counts, spec.token_budget,
                                       spec.max_batch_size, cost_values=cv, per_batch=per_batch)
        n = np.cumsum(counts[a:])
        # a bucket never pads below its own useful cost
        padded[a, a + 1:] = np.maximum(per_sample * n, np.cumsum(useful[a:]))
    return CostTable(edges, counts, useful, padded, quadratic)


def _check_k(table: CostTable, k: int) -> None:
    if k < 1:
        raise DataError(f"num_buckets must be >= 1, got {k}")
    if k > table.num_bins:
        distinct = "all lengths are equal" if table.num_bins == 1 else (
            f"the data has only {table.num_bins} candidate boundaries")
        raise DataError(f"num_buckets={k} is more buckets than can be non-empty: {distinct}; "
                        "lower num_buckets or raise `candidates`")


def _fit(table: CostTable, cuts) -> BucketFit:
    cuts = tuple(int(c) for c in cuts)
    b = table.edges[list(cuts)].copy()
    b[0] = 0
    b[-1] = table.edges[-1]
    rows = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        rows.append(float(table.useful[lo:hi].sum() / table.padded[lo, hi]))
    total = sum(table.padded[lo, hi] for lo, hi in zip(cuts[:-1], cuts[1:]))
    return BucketFit(b.astype(np.int64), cuts, float(table.useful.sum() / total), rows)


def optimal_fits(table: CostTable, k_max: int) -> list[BucketFit]:
    """The optimal fit for every K = 1..k_max (one DP pass serves them all)."""
    _check_k(table, k_max)
    g = table.num_bins
    cost = table.padded
    best = cost[0].copy()  # best[b]: one bucket covering bins [0, b)
    back = [np.zeros(g + 1, dtype=np.int64)]
    fits = [_fit(table, (0, g))]
    for k in range(2, k_max + 1):
        total = best[:, None] + cost  # [a, b]: first k-1 buckets end at a, last is [a, b)
        arg = np.argmin(total, axis=0)
        best = total[arg, np.arange(g + 1)]
        back.append(arg)
        cuts = [g]
        for level in range(k - 1, 0, -1):
            cuts.append(int(back[level][cuts[-1]]))
        cuts.append(0)
        fits.append(_fit(table, tuple(reversed(cuts))))
    return fits


def choose_auto(fits: list[BucketFit], gap: float) -> BucketFit:
    """Smallest K whose predicted efficiency is within `gap` of the largest K's."""
    top = fits[-1].predicted_efficiency
    for fit in fits:
        if fit.predicted_efficiency >= top - gap:
            return fit
    return fits[-1]


def predict(lengths, boundaries, spec: PackingSpec, quadratic: float = 0.0,
            max_bins: int = 256) -> tuple[float, list[float]]:
    """The analytic model's efficiency for any boundaries (whole plan, per bucket), each
    bucket with its own fine histogram. Models random order inside a bucket: it does not
    see `sort_window`, which only `simulate` does."""
    lengths = np.asarray(lengths, dtype=np.int64)
    bucket = np.searchsorted(boundaries, lengths, side="right") - 1
    useful_all, padded_all, rows = 0.0, 0.0, []
    for j in range(len(boundaries) - 1):
        sub = lengths[bucket == j]
        if not len(sub):
            rows.append(0.0)
            continue
        _, values, counts, _ = histogram_bins(sub, max_bins)
        per_sample = bucket_costs_from(0, values, counts, spec.token_budget, spec.max_batch_size,
                                       cost_values=slot_cost(values, quadratic))[-1]
        useful = float(slot_cost(sub, quadratic).sum())
        padded = max(float(per_sample) * len(sub), useful)
        useful_all, padded_all = useful_all + useful, padded_all + padded
        rows.append(useful / padded)
    return useful_all / padded_all, rows


def simulate_seconds(lengths, boundaries, spec: PackingSpec, time_model, anchors: int,
                     epochs: int = 1, seed: int = 0, pad_to_multiple: int = 1,
                     bucket_caps=None) -> dict:
    """Exact predicted time of the real bucketed planner's epochs: the step cost model
    summed over every batch at its padded length (rounded up to `pad_to_multiple`, as
    warmup rounds it), with the real tokens and the distinct shapes that gives."""
    planner = Planner("bucketed", lengths, boundaries, spec, seed=seed, bucket_caps=bucket_caps)
    secs, tokens, shapes = [], 0, set()
    for e in range(epochs):
        plan = planner.epoch(e)
        m = max(1, int(pad_to_multiple))
        L = -(-plan.seq_len // m) * m
        secs.append(float(time_model.run_seconds(plan.batch_sizes, L, anchors).sum()))
        tokens += int(plan.num_tokens.sum())
        shapes |= set(zip(plan.batch_sizes.tolist(), L.tolist()))
    return {"seconds_per_epoch": float(np.mean(secs)),
            "real_tokens_per_second": tokens / max(sum(secs), 1e-12),
            "distinct_shapes": len(shapes)}


def simulate(lengths, boundaries, spec: PackingSpec, epochs: int = 2, seed: int = 0,
             quadratic: float = 0.0, bucket_caps=None) -> dict:
    """Exact efficiency of the real bucketed planner (mean over epochs) and per bucket.

    Both are cost-weighted like the objective (with `quadratic` > 0 a slot at length L
    costs L + c L^2), so the per-bucket column compares with the predicted one."""
    planner = Planner("bucketed", lengths, boundaries, spec, seed=seed, bucket_caps=bucket_caps)
    k = planner.num_buckets
    useful_b = np.bincount(planner.sample_bucket, weights=slot_cost(planner.lengths, quadratic),
                           minlength=k)
    effs, rows, per_bucket = [], None, np.zeros(k)
    for e in range(epochs):
        plan = planner.epoch(e)
        slots = plan.batch_sizes * slot_cost(plan.seq_len, quadratic)
        effs.append(float(useful_b.sum() / slots.sum()))
        padded_b = np.bincount(plan.bucket, weights=slots, minlength=k)
        per_bucket += np.divide(useful_b, padded_b, out=np.zeros(k), where=padded_b > 0)
        rows = rows or bucket_table(plan, planner.boundaries)
    for r, eff in zip(rows, per_bucket / epochs):
        r["efficiency"] = float(eff)
    return {"efficiency": float(np.mean(effs)), "buckets": rows}
