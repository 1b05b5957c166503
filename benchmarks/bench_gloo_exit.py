"""How often a gloo rank aborts at exit, with and without dflash's process-group shutdown.

    python benchmarks/bench_gloo_exit.py [--runs 30]

Each run starts two CPU ranks under torchrun that take a few DDP steps, gather an object
(the last collective of every dflash run: the replica digests) and return, as a training
run does. At exit, `bare` leaves the process group to interpreter finalization;
`destroy` calls `destroy_process_group` alone; `dflash` runs
`dflash.topology.shutdown_process_group`, as `build_topology` registers it. Prints the
aborted runs per mode with a 95% Wilson interval (the race depends on scheduling).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ("bare", "destroy", "dflash")


def worker(mode: str) -> None:
    import atexit
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from dflash.topology import shutdown_process_group
    dist.init_process_group("gloo")
    atexit.register({"bare": lambda: None, "destroy": dist.destroy_process_group,
                     "dflash": shutdown_process_group}[mode])
    model = torch.nn.Linear(64, 64)
    ddp, opt = DDP(model), torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        ddp(torch.randn(8, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, "digest" * 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    from scipy.stats import binomtest
    from tqdm import tqdm
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    print(f"{'mode':>7}  {'aborted':>9}  {'95% interval':>14}  first abort message")
    for mode in MODES:
        aborted, message = 0, ""
        for _ in tqdm(range(args.runs), desc=mode, leave=False):
            proc = subprocess.run(
                # --standalone: a free port of its own for every run
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc_per_node=2", __file__, "--worker", mode],
                env=env, capture_output=True, text=True, timeout=120)
            if proc.returncode:
                aborted += 1
                lines = [ln for ln in proc.stderr.splitlines() if "terminate" in ln]
                message = message or (lines[0] if lines else proc.stderr.strip()[-200:])
        ci = binomtest(aborted, args.runs).proportion_ci(method="wilson")
        lo, hi = ci.low, ci.high
        print(f"{mode:>7}  {aborted:>4}/{args.runs:<4}  {100 * lo:5.1f}-{100 * hi:5.1f}%   {message}")


if __name__ == "__main__":
    main()
