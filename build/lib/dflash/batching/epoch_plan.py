"""Batch and EpochPlan: the objects every later stage consumes.

An epoch plan is three flat arrays (sample ids in batch order, batch offsets, one bucket
id per batch) plus each batch's padded length, so a batch's ids, bucket and shape can
never drift apart, and slicing, sharding and resuming are O(batches) array operations.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np


@dataclass(frozen=True)
class Batch:
    epoch: int
    index: int  # position in its epoch plan (or in this rank's shard of it)
    sample_ids: np.ndarray  # int64
    bucket_id: int
    seq_len: int  # padded length: the longest sample (packed: the row length)
    num_tokens: int  # real (unpadded) tokens
    # packed batches: the row (within the batch) of each sample, and the row count;
    # otherwise None / 0 and every sample is its own row
    row_of: np.ndarray | None = None
    rows: int = 0

    @property
    def batch_size(self) -> int:
        return int(len(self.sample_ids))

    @property
    def num_rows(self) -> int:
        return self.rows or self.batch_size

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_rows, self.seq_len)

    @property
    def padded_tokens(self) -> int:
        return self.num_rows * self.seq_len


@dataclass
class EpochPlan:
    epoch: int
    indices: np.ndarray  # int64 [num_samples_in_plan]
    offsets: np.ndarray  # int64 [num_batches + 1]
    bucket: np.ndarray  # int32 [num_batches]
    seq_len: np.ndarray  # int64 [num_batches] padded length of each batch
    num_tokens: np.ndarray  # int64 [num_batches] real tokens of each batch
    # packed plans (batching=packed): rows per batch [num_batches] and each position's
    # row within its batch [num_samples_in_plan]; None: one sample per row
    rows: np.ndarray | None = None
    row_of: np.ndarray | None = None

    @classmethod
    def build(cls, epoch: int, indices: np.ndarray, offsets: np.ndarray,
              bucket: np.ndarray, lengths: np.ndarray) -> "EpochPlan":
        indices = np.asarray(indices, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        ordered = lengths[indices].astype(np.int64, copy=False)
        if len(offsets) > 1:
            seq_len = np.maximum.reduceat(ordered, offsets[:-1])
            num_tokens = np.add.reduceat(ordered, offsets[:-1])
        else:
            seq_len = num_tokens = np.zeros(0, dtype=np.int64)
        return cls(epoch, indices, offsets, np.asarray(bucket, dtype=np.int32),
                   seq_len.astype(np.int64), num_tokens.astype(np.int64))

    # ---- sizes -------------------------------------------------------------------
    @property
    def num_batches(self) -> int:
        return len(self.offsets) - 1

    def __len__(self) -> int:
        return self.num_batches

    @property
    def batch_sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def batch_rows(self) -> np.ndarray:
        """Rows each batch computes (its first dimension): samples, or packed rows."""
        return self.batch_sizes if self.rows is None else self.rows

    @property
    def padded_tokens(self) -> int:
        return int(np.dot(self.batch_rows, self.seq_len))  # int64 dot: no overflow

    @property
    def useful_tokens(self) -> int:
        return int(self.num_tokens.sum(dtype=np.int64))

    @property
    def padding_efficiency(self) -> float:
        padded = self.padded_tokens
        return self.useful_tokens / padded if padded else 0.0

    # ---- access ------------------------------------------------------------------
    def __getitem__(self, step: int) -> Batch:
        if not 0 <= step < self.num_batches:
            raise IndexError(f"step {step} outside epoch {self.epoch} "
                             f"with {self.num_batches} batches")
        lo, hi = self.offsets[step], self.offsets[step + 1]
        packed = self.rows is not None
        return Batch(self.epoch, step, self.indices[lo:hi], int(self.bucket[step]),
                     int(self.seq_len[step]), int(self.num_tokens[step]),
                     self.row_of[lo:hi] if packed else None,
                     int(self.rows[step]) if packed else 0)

    def batches(self, start_step: int = 0) -> Iterator[Batch]:
        """Batches from `start_step` on: resuming mid-epoch is a slice, not a replay."""
        for step in range(start_step, self.num_batches):
            yield self[step]

    def take(self, batch_ids: np.ndarray) -> "EpochPlan":
        """A plan holding the given batches, in the given order (repeats allowed)."""
        batch_ids = np.asarray(batch_ids, dtype=np.int64)
        sizes = self.batch_sizes[batch_ids]
        offsets = np.zeros(len(batch_ids) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        # position p of new batch j reads old position old_start[j] + (p - new_start[j])
        shift = np.repeat(self.offsets[:-1][batch_ids] - offsets[:-1], sizes)
        src = np.arange(offsets[-1], dtype=np.int64) + shift
        packed = self.rows is not None
        return EpochPlan(self.epoch, self.indices[src], offsets, self.bucket[batch_ids],
                         self.seq_len[batch_ids], self.num_tokens[batch_ids],
                         self.rows[batch_ids] if packed else None,
                         self.row_of[src] if packed else None)

    # ---- files -------------------------------------------------------------------
    def save_npz(self, path: str | Path, original_ids: np.ndarray | None = None) -> None:
        ids = self.indices if original_ids is None else original_ids[self.indices]
        extra = {} if self.rows is None else {"rows": self.rows.astype(np.int64),
                                              "row": self.row_of.astype(np.int32)}
        np.savez(path, indices=ids.astype(np.int64),
                 offsets=self.offsets.astype(np.int64), bucket=self.bucket.astype(np.int32),
                 **extra)
