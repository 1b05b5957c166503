"""Expected padded tokens of one bucket under dflash's own packing.

Inside a bucket samples come in random order and are packed greedily (budget, cap). We
model the bucket as i.i.d. draws from its length histogram and follow one batch as a
Markov chain over (samples so far k, current max m): the next draw L joins when
(k + 1) * max(m, L) <= budget and k < cap, else the batch closes with k * m padded tokens
and L opens the next batch. By the renewal-reward theorem a bucket of n samples then
costs n * E[k * m] / E[k] padded tokens. The sample that overflows a batch is biased
long, so the start distribution of the next batch is refined by a few fixed-point passes
(start -> overflow distribution). The error against exact simulation is tested.

The chain is run for all buckets sharing a lower edge at once ([rows = upper edges,
cols = histogram bins]), which makes the all-pairs cost table one vectorised sweep per
lower edge.
"""
from __future__ import annotations

import numpy as np


def _chain(values, probs, start, token_budget, cap, cost_values):
    """E[k * cost(m)], E[k] and the overflow distribution for each row.

    values [G] ascending bin lengths; probs [R, G] per-row draw distribution (rows sum to
    1); start [R, G] distribution of a batch's first sample; cost_values [G] cost of one
    padded slot at that max length (the length itself, or with an attention term).
    Only maxima that still fit are carried, so the active width shrinks as k grows.
    """
    rows, g = probs.shape
    cdf = np.cumsum(probs, axis=1)
    state = start.copy()
    e_cost = np.zeros(rows)
    e_size = np.zeros(rows)
    # overflow[:, h] = probs[:, h] * (sum of from_fit over steps whose n_fit <= h + rest)
    acc = np.zeros((rows, g + 1))
    k_max = int(min(cap, token_budget // max(1, int(values[0]))))
    for k in range(1, k_max + 1):
        width = state.shape[1]
        if k == k_max:
            # every open batch closes here (cap or nothing more can fit)
            e_cost += k * (state @ cost_values[:width])
            e_size += k * state.sum(axis=1)
            acc[:, 0] += state.sum(axis=1)
            break
        n_fit = int(np.searchsorted(values, token_budget // (k + 1), side="right"))
        n_fit = min(n_fit, width)
        f_t = cdf[:, n_fit - 1] if n_fit else np.zeros(rows)
        # a fitting state continues with prob F(t); the others close for sure
        close = state.copy()
        close[:, :n_fit] *= (1.0 - f_t)[:, None]
        e_cost += k * (close @ cost_values[:width])
        e_size += k * close.sum(axis=1)
        # overflow draw: L > t from fitting states, any L from the others
        acc[:, n_fit] += state[:, :n_fit].sum(axis=1)
        acc[:, 0] += state[:, n_fit:].sum(axis=1)
        if n_fit == 0:
            break
        # next: keep the max (L <= m) or move to a new, larger max h (L = h)
        fit = state[:, :n_fit]
        below = np.cumsum(fit, axis=1) - fit
        state = fit * cdf[:, :n_fit] + probs[:, :n_fit] * below
    overflow = probs * np.cumsum(acc, axis=1)[:, :g]
    return e_cost, e_size, overflow


def bucket_costs_from(lo: int, values, weights, token_budget: int, cap: int,
                      cost_values=None, refine: int = 1, per_batch: float = 0.0) -> np.ndarray:
    """Expected padded cost per sample for buckets [lo, hi) for every hi > lo (bin indices).

    `per_batch`: a fixed cost of every batch (a step's overhead in a time model); each
    renewal cycle of the chain is one batch, so it adds per_batch / E[batch size].
    Returns an array of length G - lo: entry j is bucket bins [lo, lo + j + 1).
    """
    values = np.asarray(values[lo:], dtype=np.float64)
    w = np.asarray(weights[lo:], dtype=np.float64)
    cv = values if cost_values is None else np.asarray(cost_values[lo:], dtype=np.float64)
    g = len(values)
    tri = np.tril(np.ones((g, g)))  # row j keeps bins 0..j
    probs = tri * w[None, :]
    probs /= probs.sum(axis=1, keepdims=True)
    return _refined(values, probs, token_budget, cap, cv, per_batch, refine)


def _refined(values, probs, token_budget: int, cap: int, cv, per_batch: float,
             refine: int) -> np.ndarray:
    """Cost per sample of each row of `probs`, the batch's first draw refined by
    `refine` fixed-point passes (start -> overflow distribution)."""
    start = probs
    for _ in range(refine + 1):
        e_cost, e_size, overflow = _chain(values, probs, start, token_budget, cap, cv)
        start = overflow / np.maximum(overflow.sum(axis=1, keepdims=True), 1e-300)
    return (e_cost + per_batch) / e_size


def histogram_bins(lengths: np.ndarray, max_bins: int):
    """Candidate boundaries: every distinct length when there are few; else half the
    edges at sample quantiles (resolution where the data is dense) and half evenly
    spaced in length (so sparse tails are not lumped into one wide bin). Edges always sit
    at distinct lengths, so a tie never straddles a boundary.

    Returns (edges [G + 1], values [G] mean length per bin, counts [G] int64,
    token sums [G] int64).
    """
    srt = np.sort(lengths)
    distinct = np.unique(srt)
    if len(distinct) <= max_bins:
        edges = np.append(distinct, distinct[-1] + 1)
    else:
        half = max(1, max_bins // 2)
        quant = srt[(np.arange(half) * len(srt)) // half]
        even = np.linspace(srt[0], srt[-1], max_bins - half, endpoint=False)
        snapped = distinct[np.minimum(np.searchsorted(distinct, even), len(distinct) - 1)]
        edges = np.append(np.unique(np.concatenate([quant, snapped])), srt[-1] + 1)
    idx = np.searchsorted(edges, srt, side="right") - 1
    counts = np.bincount(idx, minlength=len(edges) - 1).astype(np.int64)
    keep = counts > 0
    if not keep.all():  # an empty bin adds nothing but a useless candidate
        edges = np.append(edges[:-1][keep], edges[-1])
        idx = np.searchsorted(edges, srt, side="right") - 1
        counts = np.bincount(idx, minlength=len(edges) - 1).astype(np.int64)
    tokens = np.bincount(idx, weights=srt, minlength=len(edges) - 1)
    tokens = np.round(tokens).astype(np.int64)
    return edges.astype(np.int64), tokens / counts, counts, tokens


def whole_bucket_cost(values, weights, token_budget: int, cap: int, cost_values=None,
                      per_batch: float = 0.0, refine: int = 1) -> float:
    """Expected cost per sample of one bucket holding every bin given (the chain above,
    one row only: cheap enough to price many caps)."""
    values = np.asarray(values, dtype=np.float64)
    probs = np.asarray(weights, dtype=np.float64)[None, :]
    cv = values if cost_values is None else np.asarray(cost_values, dtype=np.float64)
    return float(_refined(values, probs / probs.sum(), token_budget, cap, cv, per_batch, refine)[0])
