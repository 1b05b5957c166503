"""Preflight's memory estimate against reality on this CPU: one training step's peak per
device from fake tensors (`dflash.preflight.memory.estimate`) beside torch's MemTracker
following the same step on real tensors (every target layer, every LM-head chunk), for
small Qwen3 targets. MemTracker counts the context and the LM head a second time when
the step reads them (they were allocated before it, and are in the estimate once): that
difference is printed beside the gap. Then the figures at production sizes (fake only).

    python benchmarks/bench_preflight_memory.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import time

MiB = 1024.0


def small_config(hidden: int, layers: int, vocab: int):
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=hidden // 4, tie_word_embeddings=False)


def check(hidden: int, layers: int, vocab: int, rows: int, seq: int, anchors: int,
          micro: int, drafter_layers: int = 2) -> dict:
    from dflash.config import compose
    from dflash.preflight.memory import estimate
    hc = small_config(hidden, layers, vocab)
    cfg = compose("train", ["model=hf", "model.target.path=/x", "model.target.dtype=float32",
                            "model.drafter.num_anchors=512",
                            f"model.drafter.num_layers={drafter_layers}",
                            f"optim.micro_rows={micro}"])
    t0 = time.perf_counter()
    fake = estimate(hc, cfg, rows, seq, anchors, vocab - 1, queue_depth=0)
    t1 = time.perf_counter()
    real = estimate(hc, cfg, rows, seq, anchors, vocab - 1, queue_depth=0, real=True)
    t2 = time.perf_counter()
    n_taps = 5 if layers > 5 else layers - 2
    # the whole context (a row slice is a view of its storage) and the LM head
    double = (rows * seq * n_taps * hidden * 4 + vocab * hidden * 4) / 2**20
    return {"hidden": hidden, "layers": layers, "vocab": vocab, "shape": [rows, seq, anchors],
            "micro_rows": micro, "target_est_mib": fake.target_gib * MiB,
            "target_real_mib": real.target_gib * MiB, "drafter_est_mib": fake.drafter_gib * MiB,
            "drafter_real_mib": real.drafter_gib * MiB, "double_counted_mib": double,
            "estimate_s": t1 - t0, "real_s": t2 - t1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    import warnings
    warnings.filterwarnings("ignore")
    cases = [(256, 8, 8192, 4, 256, 32, 0), (256, 8, 8192, 4, 256, 32, 2),
             (384, 10, 16384, 8, 384, 64, 0), (384, 10, 16384, 8, 384, 64, 4)]
    rows = [check(*c) for c in cases]
    print(f"{'hidden':>6} {'layers':>6} {'vocab':>6} {'rows x len x anchors':>21} {'micro':>5} | "
          f"{'target est':>10} {'real':>8} | {'drafter est':>11} {'real':>8} {'gap':>6} "
          f"{'MemTracker twice':>16}")
    for r in rows:
        gap = r["drafter_real_mib"] - r["drafter_est_mib"]
        print(f"{r['hidden']:>6} {r['layers']:>6} {r['vocab']:>6} {' x '.join(map(str, r['shape'])):>21} "
              f"{r['micro_rows']:>5} | {r['target_est_mib']:>8.1f}Mi {r['target_real_mib']:>6.1f}Mi | "
              f"{r['drafter_est_mib']:>9.1f}Mi {r['drafter_real_mib']:>6.1f}Mi {gap:>+6.1f} "
              f"{r['double_counted_mib']:>14.1f}Mi")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
