"""Predicted against measured epoch time, per batching strategy, on the default world.

    python benchmarks/bench_step_cost.py [--json out.json] [override ...]

For each strategy (packed with a cost file of its own: its rows take another code
path) the step is profiled (`python -m dflash.profile`, the same code), then one epoch
is trained with `cost=FILE` and the run's predicted time (the cost model summed over
the shapes it ran) is set beside its measured training time. One process, one run per
strategy, nothing else on the machine meanwhile: the figures are one measurement each.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dflash.config import compose  # noqa: E402
from dflash.profile import run_profile  # noqa: E402
from dflash.trainer import Trainer  # noqa: E402

STRATEGIES = ["sorted", "random", "bucketed", "megabatch", "packed"]
QUIET = ["eval.enabled=false", "logger.progress=false", "epochs=1"]


def profile(tmp: str, overrides, packed: bool) -> str:
    out = os.path.join(tmp, "cost-packed.json" if packed else "cost.json")
    cfg = compose("profile", [*QUIET, *(["batching=packed"] if packed else []), *overrides,
                              f"profile.out={out}"])
    t0 = time.perf_counter()
    r = run_profile(cfg, tmp)
    print(f"profiled {r['num_points']} shapes in {time.perf_counter() - t0:.0f} s ({out}): "
          f"held-out error {100 * r['fit'].get('heldout_mean_abs_error', float('nan')):.1f}%",
          flush=True)
    return out


def measure(strategy: str, cost: str, overrides, tmp: str) -> dict:
    cfg = compose("train", [f"batching={strategy}", *QUIET, *overrides, f"cost={cost}"])
    s = Trainer(cfg, tmp).build().run()
    return {"strategy": strategy, "steps": s["steps"], "measured_seconds": s["train_seconds"],
            "predicted_seconds": s["predicted_train_seconds"],
            "error": s["predicted_train_seconds"] / s["train_seconds"] - 1.0,
            "real_tokens_per_second": s["tokens_per_second"],
            "padding_efficiency": s["padding_efficiency"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    args, overrides = ap.parse_known_args()
    tmp = tempfile.mkdtemp(prefix="dflash-step-cost-")
    strategies = args.strategies.split(",")
    costs = {False: profile(tmp, overrides, False)}
    if "packed" in strategies:
        costs[True] = profile(tmp, overrides, True)
    rows = [measure(s, costs[s == "packed"], overrides, tmp) for s in strategies]
    print(f"{'strategy':>10} {'steps':>6} {'predicted s':>12} {'measured s':>11} {'error':>7} "
          f"{'real tok/s':>11} {'efficiency':>10}")
    for r in rows:
        print(f"{r['strategy']:>10} {r['steps']:>6} {r['predicted_seconds']:>12.1f} "
              f"{r['measured_seconds']:>11.1f} {100 * r['error']:>6.1f}% "
              f"{r['real_tokens_per_second']:>11,.0f} {r['padding_efficiency']:>10.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
