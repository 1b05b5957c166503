"""The greedy packing rule shared by every strategy, vectorised.

Walk samples in order; add the next one while (count + 1) * max(current_max, length)
<= token_budget and count < max_batch_size, else close the batch. A batch opened at i
therefore holds the largest k with k * max(lengths[i:i+k]) <= budget (k <= cap), and
that predicate is monotone in k. We compute k for every possible start at once, then
follow the chain of starts, which touches one entry per batch:
  1. a narrow sliding-window pass settles every start whose batch closes early;
  2. the rest binary-search k with O(1) range maxima from a sparse table.
Comparisons use m <= budget // k (integers), so no product can overflow.
"""
from __future__ import annotations

import numpy as np

_NARROW = 8
_CHUNK_ROWS = 1 << 19


def _dtype(token_budget: int):
    # lengths <= budget: int32 scratch halves memory traffic whenever the budget fits
    return np.int32 if token_budget < np.iinfo(np.int32).max - 1 else np.int64


def _narrow_pass(padded: np.ndarray, n: int, width: int, limit: np.ndarray) -> np.ndarray:
    windows = np.lib.stride_tricks.sliding_window_view(padded, width)
    sizes = np.empty(n, dtype=np.int64)
    for s in range(0, n, _CHUNK_ROWS):
        block = windows[s:min(n, s + _CHUNK_ROWS)]
        over = np.maximum.accumulate(block, axis=1) > limit[:width]
        first = over.argmax(axis=1)
        first[~over[np.arange(len(block)), first]] = width  # every position fitted
        sizes[s:s + len(block)] = first
    return sizes


def _sparse_search(padded: np.ndarray, rows: np.ndarray, start: int, cap: int,
                   token_budget: int) -> np.ndarray:
    """Largest k in [start, cap] with k * max(padded[i:i+k]) <= budget, for i in rows."""
    levels = int(cap).bit_length()
    m = len(padded)
    table = np.empty((levels, m), dtype=padded.dtype)
    table[0] = padded
    for j in range(1, levels):
        h = 1 << (j - 1)
        np.maximum(table[j - 1, :m - h], table[j - 1, h:], out=table[j, :m - h])
        table[j, m - h:] = token_budget + 1
    flat = table.ravel()
    log2 = np.zeros(cap + 1, dtype=np.int64)
    log2[1:] = np.floor(np.log2(np.arange(1, cap + 1)))
    cur = np.full(len(rows), start, dtype=np.int64)
    for b in range(levels - 1, -1, -1):
        cand = cur + (1 << b)
        ok = cand <= cap
        k = np.where(ok, cand, 1)
        j = log2[k]
        base = j * m + rows
        mx = np.maximum(flat[base], flat[base + k - (1 << j)])
        cur = np.where(ok & (mx <= token_budget // k), cand, cur)
    return cur


def batch_sizes_from_each_start(lengths: np.ndarray, token_budget: int, cap: int,
                                segment_end: np.ndarray | None = None,
                                position_cap: np.ndarray | None = None) -> np.ndarray:
    """size[i] = samples in the batch the packing rule would open at position i.

    `position_cap[i]` (optional, <= cap): a lower cap for a batch opened at i. The rule's
    predicate is monotone in k, so the largest valid k under a lower cap c is
    min(c, the largest under cap): one clip, like the segment end."""
    n = len(lengths)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    # a batch never holds more than budget // shortest samples
    cap = int(max(1, min(cap, token_budget // max(int(lengths.min()), 1), n)))
    dt = _dtype(token_budget)
    limit = (token_budget // np.arange(1, cap + 1, dtype=np.int64)).astype(dt)
    # past the end: a sentinel longer than the budget closes every batch
    padded = np.concatenate([lengths.astype(dt, copy=False),
                             np.full(max(cap, 2), token_budget + 1, dtype=dt)])
    width = min(cap, _NARROW)
    sizes = _narrow_pass(padded, n, width, limit)
    if cap > width:
        rows = np.flatnonzero(sizes == width)
        if len(rows):
            sizes[rows] = _sparse_search(padded, rows, width, cap, token_budget)
    if segment_end is not None:
        np.minimum(sizes, segment_end - np.arange(n, dtype=np.int64), out=sizes)
    if position_cap is not None:
        np.minimum(sizes, np.asarray(position_cap, dtype=np.int64), out=sizes)
    return sizes


def pack(lengths: np.ndarray, token_budget: int, max_batch_size: int,
         segment_end: np.ndarray | None = None,
         position_cap: np.ndarray | None = None) -> np.ndarray:
    """Batch offsets (int64, num_batches + 1) for samples taken in the given order.

    `segment_end[i]` (optional) is the exclusive end of the segment holding position i;
    no batch crosses a segment end (used to pack buckets independently in one pass).
    `position_cap[i]` (optional): the cap of a batch opened at i (per-bucket batch sizes).
    """
    n = len(lengths)
    sizes = batch_sizes_from_each_start(lengths, token_budget, max_batch_size, segment_end,
                                        position_cap)
    starts = []
    i = 0
    size_list = sizes.tolist()  # python ints: the chain walk is a tight scalar loop
    while i < n:
        starts.append(i)
        i += size_list[i]
    starts.append(n)
    return np.asarray(starts, dtype=np.int64)


def segment_ends(segment_sizes: np.ndarray) -> np.ndarray:
    """For consecutive segments of the given sizes, each position's segment end."""
    segment_sizes = np.asarray(segment_sizes, dtype=np.int64)
    ends = np.cumsum(segment_sizes)
    return np.repeat(ends, segment_sizes)
