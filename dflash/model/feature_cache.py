"""The frozen target's context, kept per sample across epochs (`model.target.cache_mb`).

The target never changes, so a sample's context (its tapped hidden states) is the same
every epoch it is drawn in. On a small data set trained for many epochs (the real-model
recipe: a few hundred regenerated replies, tens of epochs) the target forward is most of
a step; kept on the host, it is paid once per sample. Each sample's context is its own
forward (the sample alone, no padding, positions from 0), so what a step sees does not
depend on which batch first met the sample: a resumed run reads the same values as the
run it continues. Packed rows and padded rows are assembled from the same per-sample
rows (a packed document's positions restart at 0 as in its own forward).

Memory: tokens x taps x hidden x the target's dtype size on every rank (SmolLM2-135M,
5 taps: 11.5 KB a token in fp32). Past `cache_mb` new samples are no longer kept: their
batches run the target as without the cache.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from dflash.errors import ConfigError

log = logging.getLogger("dflash.feature_cache")


class FeatureCache:
    def __init__(self, lengths: np.ndarray, limit_mb: float):
        if not float(limit_mb) > 0:
            raise ConfigError(f"model.target.cache_mb={limit_mb}: give the host memory to keep "
                              "contexts in, in MB (0 in the config: no cache)")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.limit = int(float(limit_mb) * 2**20)
        self.rows: dict[int, torch.Tensor] = {}  # sample id -> [len, C] on the host
        self.bytes = 0  # int: token counts stay exact past 2**31
        self.full = False
        self.hits = self.misses = 0

    @classmethod
    def build(cls, target_cfg, lengths: np.ndarray, tp_size: int = 1) -> "FeatureCache | None":
        """`model.target.cache_mb` > 0: a cache over the samples of `lengths`; None for 0."""
        mb = float(target_cfg.cache_mb)
        if mb == 0:
            return None
        if tp_size > 1:
            raise ConfigError("model.target.cache_mb needs topology.target_tp=1: a sharded "
                              "target runs every rank of its group together")
        return cls(lengths, mb)

    def spans(self, batch) -> list:
        """(sample id, row, start, length) of every sample of a planned batch, as
        `TokenDataset.collate_batch` lays them out."""
        out, fill = [], {}
        for k, sid in enumerate(batch.sample_ids):
            sid, n = int(sid), int(self.lengths[int(sid)])
            if batch.row_of is None:
                out.append((sid, k, 0, n))
            else:
                r = int(batch.row_of[k])
                out.append((sid, r, fill.get(r, 0), n))
                fill[r] = fill.get(r, 0) + n
        return out

    def _keep(self, sid: int, ctx: torch.Tensor) -> None:
        size = ctx.numel() * ctx.element_size()
        if self.bytes + size > self.limit:
            if not self.full:
                log.info("model.target.cache_mb=%.0f reached at %d samples: later samples "
                         "run the target every epoch", self.limit / 2**20, len(self.rows))
            self.full = True
            return
        self.rows[sid] = ctx
        self.bytes += size

    def context(self, forward, ids: torch.Tensor, batch) -> torch.Tensor:
        """[rows, S, C] for a device batch: kept rows, and `forward(ids [1, n])` ->
        [1, n, C] for a sample met for the first time (then kept while room is left)."""
        spans = self.spans(batch)
        parts = []
        for sid, r, lo, n in spans:
            row = self.rows.get(sid)
            if row is None:
                self.misses += 1
                row = forward(ids[r:r + 1, lo:lo + n])[0].to("cpu", copy=True)
                self._keep(sid, row)
            else:
                self.hits += 1
            parts.append(row)
        rows, s = ids.shape
        out = torch.zeros(rows, s, parts[0].shape[-1], dtype=parts[0].dtype)
        for (sid, r, lo, n), row in zip(spans, parts):
            out[r, lo:lo + n] = row
        return out.to(ids.device, non_blocking=True)
