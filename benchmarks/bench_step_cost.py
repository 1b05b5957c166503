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


def buckets_by_time(cost: str, overrides, tmp: str, k: int) -> list:
    """Padding-fitted and time-fitted boundaries (K buckets) on the default world, each
    trained for one epoch in this process: measured real tokens/s and shapes of each."""
    from dflash.buckets import run_buckets
    train = compose("train", [*QUIET, *overrides])
    fit = run_buckets(compose("bucket_fit", [
        "data=world", f"num_buckets={k}", f"cost={cost}",
        f"batching.token_budget={train.batching.token_budget}",
        f"batching.max_batch_size={train.batching.max_batch_size}",
        f"pad_to_multiple={train.warmup.pad_to_multiple}",
        f"anchors={train.model.drafter.num_anchors}"]))
    t = fit["time_fit"]
    out = []
    for name, bounds, pred in [("padding", fit["padding_boundaries"], t["padding_fit"]),
                               ("time", t["boundaries"], t)]:
        cfg = compose("train", ["batching=bucketed", *QUIET, *overrides, f"cost={cost}",
                                "buckets.kind=fixed", f"buckets.boundaries=[{','.join(map(str, bounds))}]"])
        s = Trainer(cfg, tmp).build().run()
        out.append({"fit": name, "boundaries": bounds, "predicted_seconds": pred["seconds_per_epoch"],
                    "measured_seconds": s["train_seconds"], "real_tokens_per_second": s["tokens_per_second"],
                    "distinct_shapes": s["warmup"]["distinct_run_shapes"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--buckets", type=int, default=0,
                    help="also fit K buckets to padding and to time and train one epoch of each")
    args, overrides = ap.parse_known_args()
    tmp = tempfile.mkdtemp(prefix="dflash-step-cost-")
    strategies = [s for s in args.strategies.split(",") if s]
    costs = {False: profile(tmp, overrides, False)}
    if "packed" in strategies:
        costs[True] = profile(tmp, overrides, True)
    rows = [measure(s, costs[s == "packed"], overrides, tmp) for s in strategies]
    if rows:
        print(f"{'strategy':>10} {'steps':>6} {'predicted s':>12} {'measured s':>11} "
              f"{'error':>7} {'real tok/s':>11} {'efficiency':>10}")
        for r in rows:
            print(f"{r['strategy']:>10} {r['steps']:>6} {r['predicted_seconds']:>12.1f} "
                  f"{r['measured_seconds']:>11.1f} {100 * r['error']:>6.1f}% "
                  f"{r['real_tokens_per_second']:>11,.0f} {r['padding_efficiency']:>10.3f}")
    fits = buckets_by_time(costs[False], overrides, tmp, args.buckets) if args.buckets else []
    if fits:
        print(f"{'fit':>8} {'boundaries':>40} {'predicted s':>12} {'measured s':>11} "
              f"{'real tok/s':>11} {'shapes':>7}")
        for f in fits:
            print(f"{f['fit']:>8} {str(f['boundaries']):>40} {f['predicted_seconds']:>12.2f} "
                  f"{f['measured_seconds']:>11.2f} {f['real_tokens_per_second']:>11,.0f} "
                  f"{f['distinct_shapes']:>7}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"strategies": rows, "bucket_fits": fits}, f, indent=2)


if __name__ == "__main__":
    main()
