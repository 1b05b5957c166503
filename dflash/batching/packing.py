"""The greedy packing rule shared by every strategy, vectorised.

Walk samples in order; add the next one while (count + 1) * max(current_max, length)
<= token_budget and count < max_batch_size, else close the batch. Equivalently a batch
that starts at i has size = the first k with k * cummax(lengths[i:i+k]) > budget, so we
compute that size for every possible start at once (windows of at most `cap` samples)
and then follow the chain of starts, which touches only one entry per batch.
"""
from __future__ import annotations

import numpy as np

_CHUNK_ELEMS = 1 << 22  # rows x cap per chunk: bounds the window scratch to ~16 MB


def batch_sizes_from_each_start(lengths: np.ndarray, token_budget: int, cap: int,
                                segment_end: np.ndarray | None = None) -> np.ndarray:
    """size[i] = samples in the batch the packing rule would open at position i."""
    n = len(lengths)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    # A batch can never hold more than budget // shortest samples: narrower windows.
    shortest = max(int(lengths.min()), 1)
    cap = int(max(1, min(cap, token_budget // shortest, n)))
    # k * m <= B  <=>  m <= B // k  (integers): compare against per-position limits,
    # which needs no multiplication and so cannot overflow. Lengths are <= budget, so
    # int32 suffices for the window scratch when the budget does (half the bandwidth).
    dtype = np.int32 if token_budget < np.iinfo(np.int32).max else np.int64
    limit = (token_budget // np.arange(1, cap + 1, dtype=np.int64)).astype(dtype)
    padded = np.concatenate([lengths.astype(dtype, copy=False),
                             np.full(cap - 1, token_budget + 1, dtype=dtype)])
    sizes = np.empty(n, dtype=np.int64)
    # Most batches close well before `cap` in unsorted data: try a narrow window first
    # and widen only the rows whose window was filled.
    todo = np.arange(n, dtype=np.int64)
    width = min(cap, 8)
    while True:
        windows = np.lib.stride_tricks.sliding_window_view(padded, width)
        rows = max(1, _CHUNK_ELEMS // width)
        still = []
        for s in range(0, len(todo), rows):
            idx = todo[s:s + rows]
            block = windows[idx] if len(todo) != n else windows[s:s + len(idx)]
            over = np.maximum.accumulate(block, axis=1) > limit[:width]
            first = over.argmax(axis=1)
            full = ~over[np.arange(len(idx)), first]  # every position fitted
            first[full] = width
            sizes[idx] = first
            if width < cap:
                still.append(idx[full])
        if width >= cap:
            break
        todo = np.concatenate(still) if still else todo[:0]
        if len(todo) == 0:
            break
        width = min(cap, width * 4)
    if segment_end is not None:
        np.minimum(sizes, segment_end - np.arange(n, dtype=np.int64), out=sizes)
    return sizes


def pack(lengths: np.ndarray, token_budget: int, max_batch_size: int,
         segment_end: np.ndarray | None = None) -> np.ndarray:
    """Batch offsets (int64, num_batches + 1) for samples taken in the given order.

    `segment_end[i]` (optional) is the exclusive end of the segment holding position i;
    no batch crosses a segment end (used to pack buckets independently in one pass).
    """
    n = len(lengths)
    sizes = batch_sizes_from_each_start(lengths, token_budget, max_batch_size, segment_end)
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
