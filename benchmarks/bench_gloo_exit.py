"""How often a gloo rank aborts at exit, with and without dflash's process-group shutdown.

    python benchmarks/bench_gloo_exit.py [--runs 30]

Each run starts two CPU ranks under torchrun that all-reduce a tensor, gather an object
(the last collective of every dflash run: the replica digests) and return. `bare` leaves
the process group to interpreter finalization; `dflash` registers
`dflash.topology.shutdown_process_group` at exit, as `build_topology` does. Prints the
aborted runs per mode with a 95% Wilson interval (the race depends on scheduling).
"""
from __future__ import annotations

import argparse
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worker(mode: str) -> None:
    import atexit
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    if mode == "dflash":
        from dflash.topology import shutdown_process_group
        atexit.register(shutdown_process_group)
    t = torch.ones(1000)
    for _ in range(3):
        dist.all_reduce(t)
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, "digest" * 16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--worker", choices=("bare", "dflash"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    from tqdm import tqdm
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    print(f"{'mode':>7}  {'aborted':>9}  {'95% interval':>14}  first abort message")
    for mode in ("bare", "dflash"):
        aborted, message = 0, ""
        for _ in tqdm(range(args.runs), desc=mode, leave=False):
            proc = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                 f"--master_port={free_port()}", __file__, "--worker", mode],
                env=env, capture_output=True, text=True, timeout=120)
            if proc.returncode:
                aborted += 1
                lines = [ln for ln in proc.stderr.splitlines() if "terminate" in ln]
                message = message or (lines[0] if lines else proc.stderr.strip()[-200:])
        lo, hi = wilson(aborted, args.runs)
        print(f"{mode:>7}  {aborted:>4}/{args.runs:<4}  {100 * lo:5.1f}-{100 * hi:5.1f}%   {message}")


if __name__ == "__main__":
    main()
