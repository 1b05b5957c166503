"""Memory and time of the drafter's attention mask at production scale (one sequence,
512 anchors x 3,072 context, block 16): the dense boolean mask (SDPA path), flex's
`create_block_mask` called uncompiled (it evaluates the dense mask internally), and the
tile-built BlockMask dflash uses (counts per 128x128 tile, nothing of size [Q, KV]).
Each variant runs in its own process so peaks don't mix.

    python benchmarks/bench_block_mask.py [--anchors 512] [--context 3072] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _inputs(anchors: int, context: int):
    import torch
    g = torch.Generator().manual_seed(0)
    a = torch.sort(torch.randperm(context - 16, generator=g)[:anchors]).values[None]
    return a, torch.ones(1, anchors, dtype=torch.bool), torch.ones(1, context, dtype=torch.bool)


def child(variant: str, anchors: int, context: int) -> dict:
    import torch
    from dflash.model import drafter as d

    a, ok, valid = _inputs(anchors, context)
    torch.nn.functional.pad(torch.ones(4), (0, 1))  # load torch's kernels before measuring
    base = _rss_mb()
    t0 = time.perf_counter()
    if variant == "dense":
        m = d.block_mask(a, ok, valid, 16)
        entries = m.numel()
    elif variant == "create_block_mask":
        from torch.nn.attention.flex_attention import create_block_mask
        s = context

        def mask_mod(bi, _h, q, kv):
            blk = q // 16
            is_ctx = kv < s
            return (is_ctx & (kv < a[bi, blk]) & valid[bi, kv.clamp(max=s - 1)]) | (
                ~is_ctx & ((kv - s) // 16 == blk))
        m = create_block_mask(mask_mod, 1, None, anchors * 16, s + anchors * 16, device="cpu")
        entries = m.kv_indices.numel() + m.full_kv_indices.numel()
    else:
        m = d.flex_block_mask(a, ok, valid, 16)
        entries = m.kv_indices.numel() + m.full_kv_indices.numel()
    seconds = time.perf_counter() - t0
    return {"variant": variant, "seconds": seconds, "peak_extra_mb": _rss_mb() - base,
            "stored_entries": int(entries)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--context", type=int, default=3072)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.anchors, args.context)))
        return
    rows = []
    for v in ("dense", "create_block_mask", "tile_built"):
        out = subprocess.run([sys.executable, __file__, "--child", v, "--anchors", str(args.anchors),
                              "--context", str(args.context)], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    q, kv = args.anchors * 16, args.context + args.anchors * 16
    print(f"mask for one sequence: {args.anchors} anchors x {args.context} context "
          f"(Q {q:,} x KV {kv:,}; dense bool {q * kv / 2**20:,.0f} MB)")
    print(f"{'variant':>18} {'seconds':>8} {'peak +MB':>9} {'stored':>12}")
    for r in rows:
        print(f"{r['variant']:>18} {r['seconds']:>8.3f} {r['peak_extra_mb']:>9.1f} {r['stored_entries']:>12,}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"anchors": args.anchors, "context": args.context, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
