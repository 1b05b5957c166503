"""Padding-free packing: whole samples, in the epoch's random order, into rows of a fixed
length, `rows_per_batch` rows a batch (batching=packed).

First fit over a window of open rows: each sample goes into the oldest open row with
room for it; with none, a row opens, and when `window` rows are open the fullest one is
closed first (it is the least likely to take another sample). Random order keeps the
batches as diverse as `random`'s; the window lets short samples fill the gaps long ones
leave, so rows end nearly full. Every sample lands in exactly one row; nothing depends
on anything but the order given, so a plan is a pure function of (seed, epoch).
"""
from __future__ import annotations

import numpy as np

from dflash.errors import ConfigError, DataError


def first_fit_rows(lengths: np.ndarray, row_len: int, window: int) -> np.ndarray:
    """Row id (int64, numbered as rows open) of each sample, in the order given."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if window < 1:
        raise ConfigError(f"batching.pack_window must be >= 1, got {window}")
    too_long = np.flatnonzero(lengths > row_len)
    if len(too_long):
        i = int(too_long[0])
        raise DataError(f"batching.row_len={row_len} is shorter than a sample of "
                        f"{int(lengths[i])} tokens ({len(too_long)} samples): a sample is never "
                        "split across rows; raise batching.row_len or lower data.max_seq_len")
    row_of = np.empty(len(lengths), dtype=np.int64)
    free: list[int] = []  # room left in each open row, oldest first
    ids: list[int] = []  # their row ids
    smallest = int(lengths.min()) if len(lengths) else 0
    next_id = 0
    for k, n in enumerate(lengths.tolist()):
        for j, room in enumerate(free):
            if room >= n:
                row_of[k] = ids[j]
                room -= n
                if room < smallest:  # nothing can join it any more: close it now
                    del free[j], ids[j]
                else:
                    free[j] = room
                break
        else:
            if len(free) >= window:  # close the fullest open row
                j = free.index(min(free))
                del free[j], ids[j]
            row_of[k] = next_id
            free.append(row_len - n)
            ids.append(next_id)
            next_id += 1
    return row_of


def rows_per_batch(token_budget: int, max_batch_size: int, row_len: int,
                   lengths: np.ndarray) -> int:
    """Rows of a packed batch: `token_budget // row_len`, but no more documents a batch,
    on average, than `max_batch_size`, the cap every other strategy's batch has. The cap
    bounds a step's anchors (the drafter's memory) and its real tokens: without it a
    packed step on a cap-bound profile would carry several times the others' tokens,
    and at equal real tokens train on a fraction of their optimizer steps."""
    by_budget = int(token_budget) // int(row_len)
    mean = float(np.mean(lengths)) if len(lengths) else float(row_len)
    by_cap = int(round(int(max_batch_size) * mean / int(row_len)))
    return max(1, min(by_budget, by_cap))


def anchor_slots_per_row(lengths: np.ndarray, num_anchors: int, row_len: int,
                         configured: int = 0) -> int:
    """Anchor slots of one packed row. A row holds row_len / mean length documents, and
    each would get up to `num_anchors` slots as a row of its own, so the row gets that
    many in total: sum over its expected documents of min(num_anchors, length), rounded
    up to a multiple of 8. This keeps the supervised blocks per real token (and the
    drafter's work per token) the same as the other strategies; a row with the samples'
    own `num_anchors` would train on a fraction of the blocks. `configured` > 0 wins."""
    if configured > 0:
        return int(configured)
    lengths = np.asarray(lengths, dtype=np.float64)
    per_doc = float(np.minimum(lengths, num_anchors).mean())
    slots = per_doc * row_len / float(lengths.mean())
    return int(min(row_len, max(num_anchors, -(-int(np.ceil(slots)) // 8) * 8)))


def anchor_slots(planner, num_anchors: int, anchors_per_row: int = 0) -> int:
    """Anchor slots per row of `planner`'s batches: `num_anchors`, or for packed rows the
    slots their documents would get unpacked (anchor_slots_per_row)."""
    if not planner.packs_rows:
        return int(num_anchors)
    return anchor_slots_per_row(planner.lengths, int(num_anchors), planner.spec.row_len,
                                int(anchors_per_row))


def packed_layout(order: np.ndarray, lengths: np.ndarray, row_len: int, rows_per_batch: int,
                  window: int):
    """(sample ids grouped by batch and row, batch offsets, row within batch of each
    position, rows per batch). The last batch is filled up with empty rows, so every
    batch has the same shape."""
    row_of = first_fit_rows(lengths[order], row_len, window)
    # group by row (stable: samples keep their random order inside a row)
    by_row = np.argsort(row_of, kind="stable")
    indices = order[by_row]
    rows = row_of[by_row]
    batch_of = rows // rows_per_batch
    num_batches = int(batch_of[-1]) + 1 if len(batch_of) else 0
    offsets = np.zeros(num_batches + 1, dtype=np.int64)
    np.cumsum(np.bincount(batch_of, minlength=num_batches), out=offsets[1:])
    return (indices.astype(np.int64), offsets, (rows % rows_per_batch).astype(np.int32),
            np.full(num_batches, rows_per_batch, dtype=np.int64))
