"""How much one supervised block weighs in the gradient, per batching strategy, under
each loss normaliser (optim.loss_norm), on the production length profile.

    python benchmarks/bench_block_weights.py [--samples 902087] [--json W.json]

Each sample is 60% supervised (its last 60% of tokens) and gets min(512, its anchor
candidates) blocks; budget 49,152, cap 64, buckets seed6, one epoch. Under `batch` a
block weighs 1 / (the blocks of its batch); under `plan` it weighs 1 / (the plan's mean
blocks per batch), the same everywhere. Printed: blocks per batch (p5 / p50 / p95) and
the mean weight of a block of a long sample (>= 3,296 tokens) over that of a short one
(< 770 tokens): 1.00x means the strategy does not re-weight the data.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from dflash.batching import PackingSpec, Planner
from dflash.batching.boundaries import preset_boundaries
from dflash.data.synthetic import PRODUCTION_SAMPLES, production_lengths

SETTINGS = [("sorted", 0), ("random", 0), ("bucketed", 0), ("bucketed", 4), ("megabatch", 4),
            ("packed", 0)]


def block_weights(plan, blocks: np.ndarray, norm: str) -> np.ndarray:
    """Per sample of the plan (in plan order): the weight of each of its blocks."""
    per_batch = np.add.reduceat(blocks[plan.indices], plan.offsets[:-1]).astype(np.float64)
    if norm == "plan":
        per_batch = np.full_like(per_batch, per_batch.mean())
    return np.repeat(1.0 / np.maximum(per_batch, 1), np.diff(plan.offsets))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=PRODUCTION_SAMPLES)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lengths = production_lengths(args.samples)
    supervised = np.floor(0.6 * lengths).astype(np.int64)
    blocks = np.minimum(512, np.maximum(0, supervised - 1))  # candidates: adjacent pairs
    long, short = lengths >= 3296, lengths < 770
    print(f"{len(lengths):,} samples, budget 49,152, cap 64, seed6, 512 anchor slots, 60% "
          "supervised, epoch 0")
    print(f"{'strategy':>10} {'window':>6}  {'blocks/batch p5 / p50 / p95':>28}  "
          f"{'long/short, batch':>17}  {'long/short, plan':>16}")
    rows = []
    for strategy, window in SETTINGS:
        spec = PackingSpec(49152, 64, window, row_len=8192 if strategy == "packed" else 0)
        plan = Planner(strategy, lengths, preset_boundaries("seed6"), spec, seed=0).epoch(0)
        per_batch = np.add.reduceat(blocks[plan.indices], plan.offsets[:-1])
        p5, p50, p95 = np.percentile(per_batch, [5, 50, 95])
        row = {"strategy": strategy, "sort_window": window,
               "blocks_per_batch_p5": float(p5), "blocks_per_batch_p50": float(p50),
               "blocks_per_batch_p95": float(p95)}
        ids = plan.indices
        for norm in ("batch", "plan"):
            w = block_weights(plan, blocks, norm)
            b = blocks[ids].astype(np.float64)  # a sample's blocks all weigh w
            mean = lambda sel: (w[sel] * b[sel]).sum() / b[sel].sum()  # noqa: E731
            row[f"long_over_short_{norm}"] = float(mean(long[ids]) / mean(short[ids]))
        rows.append(row)
        print(f"{strategy:>10} {window:>6}  {p5:>8,.0f} / {p50:>6,.0f} / {p95:>7,.0f}  "
              f"{row['long_over_short_batch']:>16.2f}x  {row['long_over_short_plan']:>15.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
