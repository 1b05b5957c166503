"""The closed shape set: every (batch size, padded length, anchor slots) compiled code meets.

A planned batch has a natural shape (its sample count, its longest sample). Compiled
kernels specialise on shapes, so a run that meets a new one mid-training compiles (or,
past dynamo's recompile limit, silently falls back to a dense eager path). So before
step 1 every batch of every epoch gets its *run shape*:

    natural (b, s) -> rounded (menu batch size >= b, s rounded up to `pad_to_multiple`)
                   -> the cheapest warmed shape that holds it (rows and length padded)

The warm set is picked by `warmup.policy` from the rounded shapes of the epoch plans
themselves: each `Batch` carries its own bucket and shape, so no list of bucket ids can
drift out of line with the batches (the seeds' `bucket_ids` / `batch_bucket_ids` bug).
Anchor slots are fixed (`model.drafter.num_anchors`, short rows pad them with invalid
slots), so the third dimension is a one-entry menu.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from dflash.errors import ConfigError, DataError

POLICIES = ("auto", "none", "bucket_max", "top_k", "coverage", "all")


@dataclass(frozen=True, order=True)
class Shape:
    batch_size: int
    seq_len: int
    anchors: int

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len

    def as_list(self) -> list[int]:
        return [self.batch_size, self.seq_len, self.anchors]


@dataclass(frozen=True)
class Rounding:
    pad_to_multiple: int = 1
    batch_sizes: tuple = ()  # a menu of batch sizes; () keeps the plan's own sizes
    anchors: int = 1

    def __post_init__(self):
        if self.pad_to_multiple < 1:
            raise ConfigError(f"warmup.pad_to_multiple must be >= 1, got {self.pad_to_multiple}")
        menu = list(self.batch_sizes)
        if menu and (menu != sorted(set(menu)) or menu[0] < 1):
            raise ConfigError(f"warmup.batch_sizes must be increasing positive integers, got {menu}")

    def arrays(self, batch_sizes: np.ndarray, seq_lens: np.ndarray):
        """Rounded (batch sizes, lengths) of many batches at once (int64)."""
        b = np.asarray(batch_sizes, dtype=np.int64)
        m = self.pad_to_multiple
        s = -(-np.asarray(seq_lens, dtype=np.int64) // m) * m
        if self.batch_sizes:
            menu = np.asarray(self.batch_sizes, dtype=np.int64)
            if len(b) and b.max() > menu[-1]:
                raise DataError(f"a planned batch holds {int(b.max())} samples, more than the "
                                  f"largest warmup.batch_sizes entry {int(menu[-1])}; add one "
                                  f">= batching.max_batch_size")
            b = menu[np.searchsorted(menu, b)]
        return b, s


@dataclass
class PlanShapes:
    """Every batch's natural and rounded shape over a run, with its epoch and bucket."""
    epoch: np.ndarray
    bucket: np.ndarray
    batch_size: np.ndarray
    seq_len: np.ndarray
    rounded_b: np.ndarray
    rounded_s: np.ndarray

    @classmethod
    def from_plans(cls, plans, rounding: Rounding) -> "PlanShapes":
        """From EpochPlans (or shards of them): the shapes are read off each plan's own
        per-batch arrays, so they cannot be misaligned."""
        parts = [(np.full(p.num_batches, p.epoch, np.int64), p.bucket.astype(np.int64),
                  p.batch_rows.astype(np.int64), p.seq_len.astype(np.int64)) for p in plans]
        cols = [np.concatenate(c) if c else np.zeros(0, np.int64) for c in zip(*parts)] \
            if parts else [np.zeros(0, np.int64)] * 4
        return cls.from_arrays(*cols, rounding=rounding)

    @classmethod
    def from_arrays(cls, epoch, bucket, batch_size, seq_len, rounding: Rounding) -> "PlanShapes":
        """Parallel per-batch lists: checked to agree before anything is derived."""
        cols = {"epoch": epoch, "bucket": bucket, "batch_size": batch_size, "seq_len": seq_len}
        cols = {k: np.asarray(v, dtype=np.int64) for k, v in cols.items()}
        sizes = {k: len(v) for k, v in cols.items()}
        if len(set(sizes.values())) > 1:
            raise DataError(f"per-batch lists disagree on the batch count: {sizes} (one entry "
                              "per batch each; pass batch-level bucket ids, not sample-level)")
        if len(cols["batch_size"]) and (cols["batch_size"].min() < 1 or cols["seq_len"].min() < 1):
            raise DataError("a batch with no samples or zero length reached the shape set")
        rb, rs = rounding.arrays(cols["batch_size"], cols["seq_len"])
        return cls(rounded_b=rb, rounded_s=rs, **cols)

    def rounded_counts(self) -> Counter:
        return Counter(zip(self.rounded_b.tolist(), self.rounded_s.tolist()))


def envelopes(shapes: PlanShapes) -> set:
    """One shape per bucket holding every batch of it (its largest rows and length)."""
    out = set()
    for bkt in np.unique(shapes.bucket):
        sel = shapes.bucket == bkt
        out.add((int(shapes.rounded_b[sel].max()), int(shapes.rounded_s[sel].max())))
    return out


def select(policy: str, shapes: PlanShapes, top_k: int = 8, coverage: float = 0.99,
           envelope: bool = True) -> list:
    """The (batch size, length) pairs to warm, chosen from the rounded plan shapes.

    `envelope`: top_k and coverage also warm each bucket's envelope, so the rare batch
    outside the frequent set runs padded up to a warmed shape instead of compiling."""
    chosen = _select(policy, shapes, top_k, coverage)
    if envelope and policy in ("top_k", "coverage"):
        chosen = sorted(set(chosen) | envelopes(shapes))
    return chosen


def _select(policy, shapes, top_k, coverage) -> list:
    if policy not in POLICIES:
        raise ConfigError(f"warmup.policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    counts = shapes.rounded_counts()
    by_freq = sorted(counts, key=lambda k: (-counts[k], -k[0] * k[1]))
    if policy == "none" or not counts:
        return []
    if policy == "all":
        return sorted(counts)
    if policy == "bucket_max":  # every batch padded up to its bucket's envelope
        return sorted(envelopes(shapes))
    if policy == "top_k":
        if top_k < 1:
            raise ConfigError(f"warmup.top_k must be >= 1, got {top_k}")
        return sorted(by_freq[:top_k])
    if not 0.0 < coverage <= 1.0:
        raise ConfigError(f"warmup.coverage must be in (0, 1], got {coverage}")
    # coverage: the smallest set whose steps (each batch run at the cheapest warmed shape
    # that holds it) reach the fraction; greedy by frequency, coverage re-measured each time
    total, chosen = len(shapes.rounded_b), []
    for k in by_freq:
        chosen.append(k)
        if covered_steps(shapes, chosen) >= coverage * total:
            break
    return sorted(chosen)


def covered_steps(shapes: PlanShapes, warm) -> int:
    """Batches whose rounded shape fits in some warmed shape (so they run at one)."""
    counts = shapes.rounded_counts()
    return sum(n for (b, s), n in counts.items()
               if any(b <= wb and s <= ws for wb, ws in warm))


class ShapePlan:
    """Maps each planned batch to the shape it runs at; reports what the mapping costs."""

    def __init__(self, shapes: PlanShapes, warm, rounding: Rounding, policy: str):
        self.shapes, self.rounding, self.policy = shapes, rounding, policy
        a = rounding.anchors
        # largest first: the warm run reserves peak memory before anything else
        self.warm = sorted((Shape(b, s, a) for b, s in warm), key=lambda x: (-x.tokens, -x.seq_len))
        self._map: dict = {}

    def run_shape(self, batch_size: int, seq_len: int) -> Shape:
        key = (int(batch_size), int(seq_len))
        hit = self._map.get(key)
        if hit is None:
            rb, rs = self.rounding.arrays(np.asarray([key[0]]), np.asarray([key[1]]))
            rb, rs = int(rb[0]), int(rs[0])
            fits = [w for w in self.warm if w.batch_size >= rb and w.seq_len >= rs]
            hit = min(fits, key=lambda w: (w.tokens, w.seq_len)) if fits \
                else Shape(rb, rs, self.rounding.anchors)
            self._map[key] = hit
        return hit

    def run_arrays(self, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, padded length, anchor slots) each planned batch runs at (int64), over
        the run or one epoch: what a step cost model prices."""
        sh = self.shapes
        sel = np.ones(len(sh.epoch), bool) if epoch is None else sh.epoch == epoch
        run = [self.run_shape(b, s) for b, s in zip(sh.batch_size[sel].tolist(), sh.seq_len[sel].tolist())]
        return (np.asarray([r.batch_size for r in run], np.int64),
                np.asarray([r.seq_len for r in run], np.int64),
                np.asarray([r.anchors for r in run], np.int64))

    def num_run_shapes(self) -> int:
        """Distinct shapes the run will meet (what a static compile builds graphs for)."""
        pairs = set(zip(self.shapes.batch_size.tolist(), self.shapes.seq_len.tolist()))
        return len({self.run_shape(b, s) for b, s in pairs})

    def for_batch(self, batch) -> Shape:
        return self.run_shape(batch.num_rows, batch.seq_len)

    def report(self) -> dict:
        """Per epoch: distinct shapes (natural, rounded, run), padded tokens, coverage.
        Computed once: the plan and the warm set are fixed (the logger and the summary
        both ask for it, and it walks every batch of every epoch)."""
        if getattr(self, "_report", None) is None:
            self._report = self._build_report()
        return self._report

    def _build_report(self) -> dict:
        sh = self.shapes
        run = [self.run_shape(b, s) for b, s in zip(sh.batch_size.tolist(), sh.seq_len.tolist())]
        run_b = np.asarray([r.batch_size for r in run], np.int64)
        run_s = np.asarray([r.seq_len for r in run], np.int64)
        warm = set(self.warm)
        in_warm = np.asarray([r in warm for r in run], bool)
        exact = (run_b == sh.rounded_b) & (run_s == sh.rounded_s) & in_warm
        epochs = []
        for e in np.unique(sh.epoch):
            sel = sh.epoch == e
            natural = int(np.dot(sh.batch_size[sel], sh.seq_len[sel]))
            padded = int(np.dot(run_b[sel], run_s[sel]))
            epochs.append({
                "epoch": int(e), "steps": int(sel.sum()),
                "distinct_natural": len(set(zip(sh.batch_size[sel].tolist(), sh.seq_len[sel].tolist()))),
                "distinct_rounded": len(set(zip(sh.rounded_b[sel].tolist(), sh.rounded_s[sel].tolist()))),
                "distinct_run": len(set(zip(run_b[sel].tolist(), run_s[sel].tolist()))),
                "natural_padded_tokens": natural, "run_padded_tokens": padded,
                "rounding_cost": padded / natural - 1.0 if natural else 0.0,
                "steps_covered": float(in_warm[sel].mean()) if sel.any() else 0.0,
                "steps_exact": float(exact[sel].mean()) if sel.any() else 0.0})
        return {"policy": self.policy, "pad_to_multiple": self.rounding.pad_to_multiple,
                "batch_sizes": list(self.rounding.batch_sizes), "anchors": self.rounding.anchors,
                "num_warm_shapes": len(self.warm), "warm_shapes": [w.as_list() for w in self.warm],
                "steps_covered": float(in_warm.mean()) if len(in_warm) else 0.0,
                "steps_exact": float(exact.mean()) if len(exact) else 0.0,
                "distinct_run_shapes": len(set(run)), "epochs": epochs}


def build_shape_plan(plans, warmup_cfg, anchors: int, compiles: bool = True) -> ShapePlan:
    """`compiles`: whether the run compiles or autotunes anything (model.compile, flex
    attention and the Triton CE on CUDA). `warmup=auto` warms every shape then (`all`)
    and nothing otherwise: a warm run of eager code only costs time (a real 135M target
    on CPU spent 3 min 14 s warming 11 shapes before 45 s of training)."""
    from dflash.options import choice
    rounding = Rounding(int(warmup_cfg.pad_to_multiple), tuple(int(x) for x in warmup_cfg.batch_sizes),
                        int(anchors))
    shapes = PlanShapes.from_plans(plans, rounding)
    policy = choice(warmup_cfg.policy)
    if policy == "auto":
        policy = "all" if compiles else "none"
    warm = select(policy, shapes, int(warmup_cfg.top_k), float(warmup_cfg.coverage),
                  bool(warmup_cfg.envelope))
    return ShapePlan(shapes, warm, rounding, policy)


def format_shape_report(r: dict) -> str:
    lines = [f"warmup {r['policy']}: {r['num_warm_shapes']} shapes warmed, "
             f"{100 * r['steps_covered']:.1f}% of steps at a warmed shape "
             f"({100 * r['steps_exact']:.1f}% exactly), "
             f"{r['distinct_run_shapes']} distinct run shapes "
             f"(pad_to_multiple {r['pad_to_multiple']})",
             f"{'epoch':>5} {'steps':>7} {'natural':>8} {'rounded':>8} {'run':>5} "
             f"{'pad cost':>9} {'covered':>8} {'exact':>6}"]
    for e in r["epochs"]:
        lines.append(f"{e['epoch']:>5} {e['steps']:>7} {e['distinct_natural']:>8} "
                     f"{e['distinct_rounded']:>8} {e['distinct_run']:>5} "
                     f"{100 * e['rounding_cost']:>8.2f}% {100 * e['steps_covered']:>7.1f}% "
                     f"{100 * e['steps_exact']:>5.1f}%")
    return "\n".join(lines)
