"""Bucket optimizer on the production length profile: wall time for K = 6 and 16, and
the exact-simulation efficiency of the optimum for several K against the presets.

    python benchmarks/bench_buckets.py [--samples 902087] [--candidates 256]
"""
from __future__ import annotations

import argparse
import time

from dflash.batching import PackingSpec
from dflash.batching.bucket_fit.optimal import build_cost_table, optimal_fits, simulate
from dflash.batching.boundaries import computed_boundaries, preset_boundaries
from dflash.data.synthetic import PRODUCTION_SAMPLES, production_lengths

SEED6 = preset_boundaries("seed6")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=PRODUCTION_SAMPLES)
    ap.add_argument("--candidates", type=int, default=256)
    args = ap.parse_args()
    lengths = production_lengths(args.samples)
    spec = PackingSpec(49152, 64)
    print(f"{args.samples:,} samples, budget 49,152, cap 64, {args.candidates} candidates")
    for k in (6, 16):
        t0 = time.perf_counter()
        fit = optimal_fits(build_cost_table(lengths, spec, args.candidates), k)[-1]
        print(f"K={k:>2}: optimizer wall time {time.perf_counter() - t0:.2f} s "
              f"(cost table + DP), boundaries {fit.boundaries.tolist()}")
    table = build_cost_table(lengths, spec, args.candidates)
    fits = optimal_fits(table, 32)
    print(f"\n{'buckets':>16}  {'K':>3}  {'predicted':>9}  {'simulated':>9}")
    for k in (4, 6, 8, 12, 16, 32):
        f = fits[k - 1]
        sim = simulate(lengths, f.boundaries, spec)["efficiency"]
        print(f"{'optimal':>16}  {k:>3}  {f.predicted_efficiency:9.4f}  {sim:9.4f}")
    for name in ("seed6", "quantile", "geometric", "equal_tokens"):
        b = SEED6 if name == "seed6" else computed_boundaries(name, lengths, 6)
        print(f"{name:>16}  {6:>3}  {'':>9}  {simulate(lengths, b, spec)['efficiency']:9.4f}")


if __name__ == "__main__":
    main()
