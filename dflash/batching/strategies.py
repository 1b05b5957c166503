"""The batching strategies: one Planner per data set, one EpochPlan per (seed, epoch).

Each strategy is one function in REGISTRY (at the end), registered with its traits
(`Strategy`): it orders the samples, packs them with the shared greedy rule (packed:
into rows) and, except random (already random), shuffles batch order. Code elsewhere
asks a strategy's traits (`traits(name).packs_rows`), never its name. Plans depend only on (lengths, config, seed, epoch), so
any rank can rebuild any epoch and resume at any step without replaying earlier ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from dflash.batching import boundaries as bk
from dflash.options import choice
from dflash.errors import ConfigError
from dflash.data.lengths import check_fits_budget, check_lengths
from dflash.batching.greedy import pack, segment_ends
from dflash.batching.packed_rows import packed_layout, rows_per_batch
from dflash.batching.epoch_plan import EpochPlan



@dataclass(frozen=True)
class PackingSpec:
    token_budget: int
    max_batch_size: int
    sort_window: int = 0
    row_len: int = 0  # packed only
    pack_window: int = 32  # packed only

    @classmethod
    def from_cfg(cls, cfg, max_seq_len: int | None = None) -> "PackingSpec":
        if cfg.max_batch_size < 1:
            raise ConfigError(f"batching.max_batch_size must be >= 1, got {cfg.max_batch_size}")
        if cfg.sort_window < 0:
            raise ConfigError(f"batching.sort_window must be >= 0, got {cfg.sort_window}")
        row_len = int(cfg.get("row_len", 0)) or int(max_seq_len or 0)  # 0: data.max_seq_len
        return cls(int(cfg.token_budget), int(cfg.max_batch_size), int(cfg.sort_window),
                   row_len, int(cfg.get("pack_window", 32)))


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch)]))


class Planner:
    """Plans epochs for one strategy over fixed sample lengths and bucket boundaries."""

    def __init__(self, strategy: str, lengths, boundaries, spec: PackingSpec, seed: int = 0,
                 bucket_caps=None):
        self.traits = traits(strategy)
        self.strategy = strategy
        self.lengths = check_lengths(lengths)
        if not self.packs_rows:  # packed rows have their own limit (row_len)
            check_fits_budget(self.lengths, spec.token_budget)
        if self.packs_rows:  # one shape, no buckets: a single bucket holds all
            if not 0 < spec.row_len <= spec.token_budget:
                raise ConfigError(f"batching.row_len={spec.row_len} must be in [1, token_budget="
                                f"{spec.token_budget}] for batching=packed (0 takes "
                                "data.max_seq_len)")
            top = max(spec.row_len, int(self.lengths.max(initial=0))) + 1
            boundaries = np.array([0, top], dtype=np.int64)
        self.boundaries = bk.check_boundaries(boundaries, self.lengths)
        self.spec = spec
        if int(seed) < 0:  # numpy's generators take no negative seed
            raise ConfigError(f"seed={seed}: give a seed >= 0")
        self.seed = int(seed)
        self.sample_bucket = bk.assign(self.lengths, self.boundaries)
        self.num_buckets = len(self.boundaries) - 1
        # per-bucket batch size caps (bucketed only; None: max_batch_size for every bucket)
        self.bucket_caps = bk.check_bucket_caps(bucket_caps, self.num_buckets, spec.max_batch_size)
        # int16 bucket keys let numpy's stable argsort use radix sort (3x faster)
        self._bucket_key = (self.sample_bucket.astype(np.int16) if self.num_buckets < 2**15
                            else self.sample_bucket)
        if self.traits.static:
            # Static batches: computed once, only their order changes per epoch.
            order = np.argsort(self.lengths, kind="stable")
            self._static = self._finish(0, order, pack(self.lengths[order], spec.token_budget,
                                                       spec.max_batch_size))

    @property
    def packs_rows(self) -> bool:
        return self.traits.packs_rows

    @property
    def rows_per_batch(self) -> int:
        """Packed: rows a batch (packed_rows.rows_per_batch); 0 for the other strategies."""
        if not self.packs_rows:
            return 0
        return rows_per_batch(self.spec.token_budget, self.spec.max_batch_size,
                              self.spec.row_len, self.lengths)

    @property
    def num_samples(self) -> int:
        return len(self.lengths)

    def window_samples(self) -> int:
        """Samples per sort window: `sort_window` batches' worth at the mean length."""
        per_batch = self.spec.token_budget // max(1, int(round(self.lengths.mean())))
        per_batch = max(1, min(self.spec.max_batch_size, per_batch))
        return self.spec.sort_window * per_batch

    def epoch(self, epoch: int) -> EpochPlan:
        return self.traits.plan(self, epoch, epoch_rng(self.seed, epoch))

    # ---- helpers -----------------------------------------------------------------
    def _sort_windows(self, order: np.ndarray, segment: np.ndarray, window: int) -> np.ndarray:
        """Sort consecutive windows of `window` samples (restarting at each segment).

        Windows alternate ascending/descending so that where greedy packing runs across
        a window edge it joins similar lengths (long with long, short with short).
        """
        starts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]])
        seg_start = np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        local = np.arange(len(order)) - seg_start
        win = local // window
        global_win = np.cumsum(local % window == 0) - 1
        lens = self.lengths[order]
        top = int(lens.max()) + 1
        # one int64 key (window, then length up or down) sorts in a single stable pass
        key = global_win * (top + 1) + np.where(win % 2 == 0, lens, top - lens)
        return order[np.argsort(key, kind="stable")]

    def _finish(self, epoch: int, order: np.ndarray, offsets: np.ndarray) -> EpochPlan:
        plan = EpochPlan.build(epoch, order, offsets, np.zeros(len(offsets) - 1, np.int32),
                               self.lengths)
        # A batch's bucket: the bucket of its longest sample (for `bucketed` every sample
        # of a batch is in that bucket); it names the padded shape family for warmup.
        plan.bucket = bk.assign(plan.seq_len, self.boundaries)
        return plan

    def _packed(self, epoch: int, order: np.ndarray, rng: np.random.Generator) -> EpochPlan:
        spec = self.spec
        indices, offsets, row_of, rows = packed_layout(
            order, self.lengths, spec.row_len, self.rows_per_batch, spec.pack_window)
        plan = self._finish(epoch, indices, offsets)
        plan.seq_len[:] = spec.row_len  # every batch: rows x row_len, one shape
        plan.rows, plan.row_of = rows, row_of
        return plan.take(rng.permutation(plan.num_batches))

    def _static_shuffled(self, epoch: int, rng: np.random.Generator) -> EpochPlan:
        base = self._static
        plan = base.take(rng.permutation(base.num_batches))
        plan.epoch = epoch
        return plan


def build_planner(batching_cfg, lengths, boundaries, seed: int,
                  max_seq_len: int | None = None, bucket_caps=None) -> Planner:
    return Planner(choice(batching_cfg.strategy), lengths, boundaries,
                   PackingSpec.from_cfg(batching_cfg, max_seq_len), seed=seed,
                   bucket_caps=bucket_caps)


def planner_for(cfg, lengths) -> tuple[np.ndarray, Planner]:
    """A run's boundaries and planner from its whole config (data, batching, buckets,
    seed): the buckets preset's boundaries and per-bucket caps, checked against the data."""
    boundaries = bk.resolve_boundaries(cfg.buckets, lengths, int(cfg.data.max_seq_len))
    caps = bk.resolve_bucket_caps(cfg.buckets, len(boundaries) - 1, int(cfg.batching.max_batch_size))
    return boundaries, build_planner(cfg.batching, lengths, boundaries, int(cfg.seed),
                                     int(cfg.data.max_seq_len), bucket_caps=caps)


# ---- the strategies: one function each, (planner, epoch, rng) -> EpochPlan ------------
def _sorted(p: Planner, epoch: int, rng) -> EpochPlan:
    """Length-sorted batches, fixed once; only their order changes per epoch."""
    return p._static_shuffled(epoch, rng)


def _random(p: Planner, epoch: int, rng) -> EpochPlan:
    """A full shuffle, then the greedy rule (already random: no batch-order shuffle)."""
    perm = rng.permutation(p.num_samples)
    return p._finish(epoch, perm, pack(p.lengths[perm], p.spec.token_budget,
                                       p.spec.max_batch_size))


def _megabatch(p: Planner, epoch: int, rng) -> EpochPlan:
    """A full shuffle, sorted windows of `sort_window` batches' worth, greedy, shuffled."""
    perm = rng.permutation(p.num_samples)
    order = p._sort_windows(perm, np.zeros(len(perm), dtype=np.int64), max(1, p.window_samples()))
    plan = p._finish(epoch, order, pack(p.lengths[order], p.spec.token_budget,
                                        p.spec.max_batch_size))
    return plan.take(rng.permutation(plan.num_batches))


def _bucketed(p: Planner, epoch: int, rng) -> EpochPlan:
    """Shuffled inside each bucket (optionally sorted windows), greedy per bucket (each
    with its own cap when `bucket_caps` is set), batch order shuffled."""
    perm = rng.permutation(p.num_samples)
    # stable sort by bucket keeps the random order inside each bucket
    order = perm[np.argsort(p._bucket_key[perm], kind="stable")]
    counts = np.bincount(p.sample_bucket, minlength=p.num_buckets)
    if p.spec.sort_window > 0:
        order = p._sort_windows(order, p.sample_bucket[order], p.window_samples())
    caps = None if p.bucket_caps is None else p.bucket_caps[p.sample_bucket[order]]
    plan = p._finish(epoch, order, pack(p.lengths[order], p.spec.token_budget,
                                        p.spec.max_batch_size, segment_end=segment_ends(counts),
                                        position_cap=caps))
    return plan.take(rng.permutation(plan.num_batches))


def _packed(p: Planner, epoch: int, rng) -> EpochPlan:
    """A full shuffle packed whole into rows of row_len (first fit), one shape a batch."""
    return p._packed(epoch, rng.permutation(p.num_samples), rng)


@dataclass(frozen=True)
class Strategy:
    """A strategy's plan function and what sets it apart, for the code that must know."""
    plan: Callable  # (planner, epoch, rng) -> EpochPlan
    packs_rows: bool = False  # documents packed into fixed rows: one shape, position ids
    uses_buckets: bool = False  # batches stay inside a bucket (per-bucket caps apply)
    static: bool = False  # the batches are fixed once; only their order changes


REGISTRY = {"sorted": Strategy(_sorted, static=True), "random": Strategy(_random),
            "bucketed": Strategy(_bucketed, uses_buckets=True),
            "megabatch": Strategy(_megabatch), "packed": Strategy(_packed, packs_rows=True)}
STRATEGIES = tuple(REGISTRY)


def traits(strategy: str) -> Strategy:
    if strategy not in REGISTRY:
        raise ConfigError(f"batching.strategy must be one of {STRATEGIES}, got {strategy!r}")
    return REGISTRY[strategy]
