"""Step time of the real training loop, sequential (`pipeline.depth=0`) vs pipelined.

    python benchmarks/bench_pipeline.py [--steps 60] [--json out.json] [override ...]

Both stages are the runner's own: the frozen target's forward and the drafter step
(forward, backward, AdamW) on synthetic data. On the CPU each stage gets one core
(`torch.set_num_threads(1)`), as on GPU each gets its own device; sequential then leaves
one core idle, and the pipeline's floor is the slower stage's time (0.5x when balanced).
Two settings: model sizes chosen so the stages take about the same time, and a target
three times as deep (the step should approach the target's own time). A third row runs
sequential with every core, the CPU default (`pipeline.depth=null` is 0 where both stages
share the CPU): pipelining only pays where the target has a device of its own.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from dflash.loggers import Logger  # noqa: E402
from dflash.config import compose  # noqa: E402
from dflash.trainer import Trainer  # noqa: E402

BASE = ["data=synthetic", "data.num_samples=1000", "eval.enabled=false", "logger.progress=false",
        "batching=sorted", "epochs=1", "warmup=none", "model.target.hidden_size=256",
        "model.target.intermediate_size=768", "model.target.num_attention_heads=4",
        "model.drafter.num_layers=1", "model.drafter.num_anchors=16", "logger.log_every=1000"]
# the target runs up to its layer L-3 (the last one the drafter reads)
SETTINGS = {"balanced": ["model.target.num_hidden_layers=10"],
            "slow_target": ["model.target.num_hidden_layers=26"]}


def run(depth: int, steps: int, overrides) -> dict:
    cfg = compose("train", [*BASE, *overrides, f"pipeline.depth={depth}",
                                f"optim.max_steps={steps}"])
    s = Trainer(cfg, "/tmp/dflash-bench-pipeline").build().train(Logger())
    st = s["stage_ms"]  # the last interval's means: the whole run here (log_every > steps)
    return {"step_s": s["train_seconds"] / s["steps"], "target_s": st["time_target_ms"] / 1000,
            "drafter_s": st["time_drafter_ms"] / 1000, "drafter_wait_s": st["time_drafter_wait_ms"] / 1000}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    cores = torch.get_num_threads()
    out = {}
    print(f"{'setting':>12} {'mode':>16} {'step s':>8} {'target s':>9} {'drafter s':>10} {'ratio':>6}")
    for name, extra in SETTINGS.items():
        torch.set_num_threads(cores)
        seq_all = run(0, a.steps, [*extra, *a.overrides])
        torch.set_num_threads(1)
        seq = run(0, a.steps, [*extra, *a.overrides])
        pipe = run(a.depth, a.steps, [*extra, *a.overrides])
        ratio = pipe["step_s"] / seq["step_s"]
        for mode, r in ((f"sequential {cores} cores", seq_all), ("sequential", seq),
                        ("pipelined", pipe)):
            print(f"{name:>12} {mode:>16} {r['step_s']:>8.4f} {r['target_s']:>9.4f} "
                  f"{r['drafter_s']:>10.4f} {r['step_s'] / seq['step_s']:>6.2f}")
        out[name] = {"sequential": seq, "pipelined": pipe, "ratio": ratio,
                     "sequential_all_cores": seq_all}
    result = {"sequential_step_s": out["balanced"]["sequential"]["step_s"],
              "pipelined_step_s": out["balanced"]["pipelined"]["step_s"],
              "ratio": out["balanced"]["ratio"], "settings": out, "steps": a.steps,
              "depth": a.depth, "threads_per_stage": 1, "cores": cores}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
