"""Seconds to plan one epoch of the production length profile, per strategy, and the
cost of resuming mid-epoch. Prints figures; no thresholds (the aim is < 0.5 s/epoch).

    python benchmarks/bench_plan.py [--samples 902087] [--repeats 5]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from dflash.batching import PackingSpec, Planner
from dflash.batching.boundaries import preset_boundaries
from dflash.batching.report import plan_report
from dflash.data.synthetic import PRODUCTION_SAMPLES, production_lengths

SEED6 = preset_boundaries("seed6")


def best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), float(np.median(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=PRODUCTION_SAMPLES)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    lengths = production_lengths(args.samples)
    print(f"{args.samples:,} samples, budget 49,152, cap 64, buckets seed6, best/median of "
          f"{args.repeats}")
    print(f"{'strategy':>18}  {'plan s (best)':>13}  {'median':>7}  {'resume s':>8}  "
          f"{'efficiency':>10}  {'mixing':>7}  {'pair_repeat':>11}")
    for strategy, window in [("sorted", 0), ("random", 0), ("bucketed", 0),
                             ("bucketed+window4", 4), ("megabatch", 4), ("packed", 0)]:
        name = strategy.split("+")[0]
        # packed: rows of data.max_seq_len = 8192 tokens, 6 a batch
        spec = PackingSpec(49152, 64, window, row_len=8192)
        planner = Planner(name, lengths, SEED6, spec, seed=0)
        epoch = [3]

        def plan_one():
            epoch[0] += 1
            planner.epoch(epoch[0])
        best, med = best_of(plan_one, args.repeats)

        # resume at (epoch 7, middle step): rebuild that epoch's plan, take the tail
        def resume():
            p = Planner(name, lengths, SEED6, spec, seed=0).epoch(7)
            next(iter(p.batches(start_step=len(p) // 2)))
        rbest, _ = best_of(resume, 3)
        rep = plan_report(planner, epochs=2)
        print(f"{strategy:>18}  {best:13.3f}  {med:7.3f}  {rbest:8.3f}  "
              f"{rep['padding_efficiency']:10.4f}  {rep['length_mixing']:7.4f}  "
              f"{rep['pair_repeat_rate']:11.4f}")


if __name__ == "__main__":
    main()
