"""Predicted against measured epoch time, per batching strategy, on the default world.

    python benchmarks/bench_step_cost.py [--json out.json] [--buckets K] [--threads N] [override ...]

For each strategy (packed with a cost file of its own: its rows take another code
path) the step is profiled (`python -m dflash.profile`, the same code), then one epoch
is trained with `cost=FILE` and the run's predicted time (the cost model summed over
the shapes it ran) is set beside its measured training time.

A shared VM's speed moves between minutes by more than the model's error, so the
script also times a speed probe: the real step at one fixed shape (median of 7), right
after the profile and right before and after every epoch. `probe` is the epoch's probe
over the profile's (1.00: the machine ran at the profile's speed); `adjusted` is the
error of the prediction scaled by it. Both are printed: the raw error is what a user
of a quiet machine sees, the adjusted one isolates the model from the machine's drift.

`--threads N` runs profile and epochs on N CPU threads (the cost file records the
count, so the two always match). On a shared VM whose second core comes and goes
(`benchmarks/bench_cpu_speed.py` measures it), one thread is the steady measure.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dflash.config import compose  # noqa: E402
from dflash.profile import run_profile  # noqa: E402
from dflash.trainer import Trainer  # noqa: E402
from dflash.warmup.run import dummy_batch  # noqa: E402
from dflash.warmup.shapes import Shape  # noqa: E402

STRATEGIES = ["sorted", "random", "bucketed", "megabatch", "packed"]
QUIET = ["eval.enabled=false", "logger.progress=false", "epochs=1"]


class Probe:
    """The real step at one fixed shape on a trainer of its own: seconds, median of 7."""

    def __init__(self, overrides, tmp: str, shape: Shape):
        self.trainer = Trainer(compose("train", [*QUIET, *overrides]), os.path.join(tmp, "probe")).build()
        self.batch = dummy_batch(shape, int(self.trainer.target.vocab_size),
                                 self.trainer.train_step.target_device)
        self()  # warm

    def __call__(self) -> float:
        times = []
        for _ in range(7):
            t = time.perf_counter()
            self.trainer.train_step(self.batch)
            times.append(time.perf_counter() - t)
        return float(np.median(times))

    def around(self, trainer, speed0: float) -> tuple[dict, float]:
        """Train `trainer`'s run between two probes: its summary, and the machine's
        speed during it over `speed0` (the mean of the probes before and after)."""
        before = self()
        summary = trainer.run()
        return summary, (before + self()) / 2 / speed0


def profile(tmp: str, overrides, packed: bool) -> tuple[str, list]:
    out = os.path.join(tmp, "cost-packed.json" if packed else "cost.json")
    cfg = compose("profile", [*QUIET, *(["batching=packed"] if packed else []), *overrides,
                              f"profile.out={out}"])
    t0 = time.perf_counter()
    r = run_profile(cfg, tmp)
    print(f"profiled {r['num_points']} shapes in {time.perf_counter() - t0:.0f} s ({out}): "
          f"held-out error {100 * r['fit'].get('heldout_mean_abs_error', float('nan')):.1f}%, "
          f"repeat spread {100 * r['fit'].get('repeat_spread', float('nan')):.1f}%",
          flush=True)
    with open(out) as f:
        return out, json.load(f)["points"]


def measure(strategy: str, cost: str, overrides, tmp: str, probe, speed0: float) -> dict:
    cfg = compose("train", [f"batching={strategy}", *QUIET, *overrides, f"cost={cost}"])
    s, drift = probe.around(Trainer(cfg, tmp).build(), speed0)
    return {"strategy": strategy, "steps": s["steps"], "measured_seconds": s["train_seconds"],
            "predicted_seconds": s["predicted_train_seconds"],
            "error": s["predicted_train_seconds"] / s["train_seconds"] - 1.0,
            "probe": drift, "adjusted_error": s["predicted_train_seconds"] * drift / s["train_seconds"] - 1.0,
            "real_tokens_per_second": s["tokens_per_second"],
            "padding_efficiency": s["padding_efficiency"]}


def buckets_by_time(cost: str, overrides, tmp: str, k: int, probe, speed0: float) -> list:
    """Padding-fitted and time-fitted boundaries (K buckets) on the default world, and
    the time fit's per-bucket caps when it found any, each trained for one epoch in this
    process: predicted and measured time, real tokens/s and shapes of each."""
    from dflash.buckets import run_buckets
    train = compose("train", [*QUIET, *overrides])
    fit = run_buckets(compose("bucket_fit", [
        "data=world", f"num_buckets={k}", f"cost={cost}",
        f"batching.token_budget={train.batching.token_budget}",
        f"batching.max_batch_size={train.batching.max_batch_size}",
        f"pad_to_multiple={train.warmup.pad_to_multiple}",
        f"anchors={train.model.drafter.num_anchors}"]))
    t = fit["time_fit"]
    runs = [("padding", fit["padding_boundaries"], None, t["padding_fit"])]
    caps = t.get("caps")
    runs.append(("time", t["boundaries"], None, caps["without_caps"] if caps else t))
    if caps:
        runs.append(("time+caps", t["boundaries"], caps["caps"], caps["with_caps"]))
    out = []
    for name, bounds, cap, pred in runs:
        extra = [f"buckets.max_batch_size=[{','.join(map(str, cap))}]"] if cap else []
        cfg = compose("train", ["batching=bucketed", *QUIET, *overrides, f"cost={cost}",
                                "buckets.kind=fixed",
                                f"buckets.boundaries=[{','.join(map(str, bounds))}]", *extra])
        s, drift = probe.around(Trainer(cfg, tmp).build(), speed0)
        out.append({"fit": name, "boundaries": bounds, "caps": cap,
                    "predicted_seconds": s["predicted_train_seconds"],
                    "fit_predicted_seconds": pred["seconds_per_epoch"],
                    "measured_seconds": s["train_seconds"], "probe": drift,
                    "real_tokens_per_second": s["tokens_per_second"],
                    "distinct_shapes": s["warmup"]["distinct_run_shapes"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--buckets", type=int, default=0,
                    help="also fit K buckets to padding and to time and train one epoch of each")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    args, overrides = ap.parse_known_args()
    if args.threads < 0:
        ap.error(f"--threads must be 0 (torch's default) or a count, not {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{torch.get_num_threads()} CPU threads", flush=True)
    tmp = tempfile.mkdtemp(prefix="dflash-step-cost-")
    strategies = [s for s in args.strategies.split(",") if s]
    cost, points = profile(tmp, overrides, False)
    costs = {False: cost}
    mid = sorted(points, key=lambda p: p["seconds"])[len(points) // 2]
    probe = Probe(overrides, tmp, Shape(mid["rows"], mid["seq_len"], mid["anchors"]))
    speed = {False: probe()}
    print(f"speed probe: {mid['rows']} x {mid['seq_len']} x {mid['anchors']} anchors, "
          f"{1e3 * speed[False]:.1f} ms after the profile", flush=True)
    if "packed" in strategies:
        costs[True], _ = profile(tmp, overrides, True)
        speed[True] = probe()
    rows = [measure(s, costs[s == "packed"], overrides, tmp, probe, speed[s == "packed"])
            for s in strategies]
    if rows:
        print(f"{'strategy':>10} {'steps':>6} {'predicted s':>12} {'measured s':>11} "
              f"{'error':>7} {'probe':>6} {'adjusted':>9} {'real tok/s':>11} {'efficiency':>10}")
        for r in rows:
            print(f"{r['strategy']:>10} {r['steps']:>6} {r['predicted_seconds']:>12.1f} "
                  f"{r['measured_seconds']:>11.1f} {100 * r['error']:>6.1f}% {r['probe']:>6.2f} "
                  f"{100 * r['adjusted_error']:>8.1f}% "
                  f"{r['real_tokens_per_second']:>11,.0f} {r['padding_efficiency']:>10.3f}")
    fits = (buckets_by_time(costs[False], overrides, tmp, args.buckets, probe, speed[False])
            if args.buckets else [])
    if fits:
        print(f"{'fit':>10} {'boundaries':>34} {'caps':>22} {'predicted s':>12} {'measured s':>11} "
              f"{'probe':>6} {'real tok/s':>11} {'shapes':>7}")
        for f in fits:
            print(f"{f['fit']:>10} {str(f['boundaries']):>34} {str(f['caps'] or '-'):>22} "
                  f"{f['predicted_seconds']:>12.2f} {f['measured_seconds']:>11.2f} "
                  f"{f['probe']:>6.2f} {f['real_tokens_per_second']:>11,.0f} "
                  f"{f['distinct_shapes']:>7}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"strategies": rows, "bucket_fits": fits}, f, indent=2)


if __name__ == "__main__":
    main()
