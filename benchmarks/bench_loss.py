"""Peak memory and time of LM head + weighted CE (forward + backward) on CPU at the
Qwen3 vocabulary (151,936): naive full logits vs the chunked path (the torch reference
of the fused Triton kernel). Each variant runs in its own process so peaks don't mix.

    python benchmarks/bench_loss.py [--tokens 2048] [--hidden 256] [--chunk 0]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

VOCAB = 151_936


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(variant: str, tokens: int, hidden: int, chunk: int) -> dict:
    import torch
    from dflash.kernels import fused_lm_head_ce, naive_lm_head_ce

    torch.manual_seed(0)
    h = torch.randn(tokens, hidden, requires_grad=True)
    w = torch.randn(VOCAB, hidden) * 0.02
    y = torch.randint(0, VOCAB, (tokens,))
    wt = torch.rand(tokens)
    base = _rss_mb()
    t0 = time.perf_counter()
    if variant == "naive":
        loss, _, _ = naive_lm_head_ce(h, w, y, wt)
    else:
        loss, _, _ = fused_lm_head_ce(h, w, y, wt, chunk=chunk, impl="torch")
    loss.backward()
    return {"variant": variant, "seconds": time.perf_counter() - t0,
            "peak_extra_mb": _rss_mb() - base, "loss": float(loss)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=0,
                    help="rows per chunk; 0: the training default (model.loss_chunk_mb=256)")
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.tokens, args.hidden, args.chunk)))
        return
    import torch
    from dflash.kernels.lm_head_loss import auto_chunk
    rows = args.chunk or auto_chunk(VOCAB, torch.float32, "torch", 256)
    print(f"tokens {args.tokens}, hidden {args.hidden}, vocab {VOCAB:,}, chunk {rows} rows"
          f"{' (default: 256 MB of logits)' if not args.chunk else ''}; "
          f"logits alone would be {args.tokens * VOCAB * 4 / 2**20:,.0f} MB in fp32")
    rows = []
    for variant in ("naive", "chunked"):
        out = subprocess.run([sys.executable, __file__, "--child", variant, "--tokens",
                              str(args.tokens), "--hidden", str(args.hidden), "--chunk",
                              str(args.chunk)], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for r in rows:
        print(f"{r['variant']:>8}: peak +{r['peak_extra_mb']:8.0f} MB   {r['seconds']:6.2f} s   "
              f"loss {r['loss']:.5f}")
    print(f"peak memory ratio naive/chunked: {rows[0]['peak_extra_mb'] / rows[1]['peak_extra_mb']:.1f}x")


if __name__ == "__main__":
    main()
