"""How steady is this machine? The real training step at one fixed shape, timed over
and over, in windows that alternate between thread counts (so every count sees the
same stretch of the machine's time).

    python benchmarks/bench_cpu_speed.py [--seconds 120] [--window 4] [--threads 1,2]

Per thread count: the median step, and the spread of the windows' medians (slowest
over fastest). A cost model cannot predict an epoch better than the machine repeats
itself: on a shared VM whose second core comes and goes, the spread with all cores is
the floor of any prediction's error, and one thread may be the steadier measure.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dflash.config import compose  # noqa: E402
from dflash.trainer import Trainer  # noqa: E402
from dflash.warmup.run import dummy_batch  # noqa: E402
from dflash.warmup.shapes import Shape  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--window", type=float, default=4.0, help="seconds per window")
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}")
    ap.add_argument("--shape", default="8,136,32", help="rows,padded length,anchor slots")
    args, overrides = ap.parse_known_args()
    counts = sorted({int(t) for t in args.threads.split(",")})
    trainer = Trainer(compose("train", ["eval.enabled=false", "logger.progress=false", *overrides]),
                      tempfile.mkdtemp(prefix="dflash-speed-")).build()
    batch = dummy_batch(Shape(*map(int, args.shape.split(","))), int(trainer.target.vocab_size),
                        trainer.train_step.target_device)
    windows: dict[int, list] = {n: [] for n in counts}
    steps: dict[int, list] = {n: [] for n in counts}
    end, k = time.perf_counter() + args.seconds, 0
    while time.perf_counter() < end:
        n = counts[k % len(counts)]
        torch.set_num_threads(n)
        trainer.train_step(batch)  # the first step after a thread change is not timed
        times, stop = [], time.perf_counter() + args.window
        while time.perf_counter() < stop:
            t = time.perf_counter()
            trainer.train_step(batch)
            times.append(time.perf_counter() - t)
        windows[n].append(float(np.median(times)))
        steps[n] += times
        k += 1
    print(f"step at {args.shape} (rows,length,anchors), {args.seconds:.0f} s in {args.window:.0f} s "
          f"windows alternating {counts} threads, on {os.cpu_count()} cores")
    print(f"{'threads':>7} {'windows':>7} {'median ms':>9} {'fastest window':>14} "
          f"{'slowest window':>14} {'spread':>7}")
    for n in counts:
        w = np.array(windows[n])
        print(f"{n:>7} {len(w):>7} {1e3 * np.median(steps[n]):>9.1f} {1e3 * w.min():>14.1f} "
              f"{1e3 * w.max():>14.1f} {100 * (w.max() / w.min() - 1):>6.1f}%")


if __name__ == "__main__":
    main()
