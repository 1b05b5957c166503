"""Drafter step cost per layer layout at long rows: what a sliding window saves.

    python benchmarks/bench_layouts.py [--length 4096] [--window 512] [--reps 5] [--json PATH]

One row of `length` tokens, 64 anchors spread over it (block 16), a 2-layer drafter of
hidden 256 on a random context: forward + backward of the drafter alone (the target's
cost does not depend on the layout), for [full, full], [sliding, full] and
[sliding, sliding] (window `window`, causal blocks), on the attention backend this
machine uses (chunked SDPA on CPU, flex on CUDA). Prints the median of `reps` timed
repetitions (after one untimed) with the min-max range.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

LAYOUTS = {"full, full": ["full_attention"] * 2,
           "sliding, full": ["sliding_attention", "full_attention"],
           "sliding, sliding": ["sliding_attention"] * 2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.reps < 1 or args.window < 1 or args.length < 64:
        ap.error("--reps and --window must be >= 1, --length >= 64")
    from dflash.model.drafter import DFlashDrafter, DrafterSpec
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(0)
    s, h, a = args.length, 256, 64
    ctx = torch.randn(1, s, 2 * h, generator=g).to(dev)
    anchors = torch.linspace(16, s - 17, a).long()[None].to(dev)
    ok = torch.ones_like(anchors, dtype=torch.bool)
    emb = torch.randn(1, a, 16, h, generator=g).to(dev)
    valid = torch.ones(1, s, dtype=torch.bool, device=dev)
    rows = []
    print(f"{'layers':>18} {'ms (min-max)':>22}   row {s}, window {args.window}, {dev.type}")
    for name, kinds in LAYOUTS.items():
        torch.manual_seed(0)
        d = DFlashDrafter(DrafterSpec(
            hidden_size=h, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
            intermediate_size=768, vocab_size=1000, num_target_layers=8,
            target_layer_ids=[1, 5], layer_types=kinds, sliding_window=args.window,
            causal=True)).to(dev)
        times = []
        for rep in range(args.reps + 1):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            d(ctx, valid, anchors, ok, emb).square().mean().backward()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if rep:
                times.append(1e3 * (time.perf_counter() - t0))
            d.zero_grad(set_to_none=True)
        t = np.asarray(times)
        rows.append({"layers": name, "ms": float(np.median(t)), "range_ms": [float(t.min()), float(t.max())],
                     "length": s, "window": args.window, "device": dev.type})
        print(f"{name:>18} {np.median(t):10.1f} ({t.min():.0f}-{t.max():.0f})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
