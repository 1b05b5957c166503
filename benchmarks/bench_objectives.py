"""Step cost of each objective (loss=ce|dpace|kl): target stage + drafter forward/backward.

    python benchmarks/bench_objectives.py [--reps 7] [--vocab 32000] [--json PATH]

One batch (4 rows x 512 tokens, 64 anchors a row, block 16) through a Qwen3 target of
hidden 256, 8 layers and the given vocabulary (random weights: cost, not quality) and a
1-layer drafter. ce and dpace stop the target after its last tapped layer; kl runs it to
the end (its final hidden state) and computes both sides' logits. Prints the median of
`reps` timed repetitions (after one untimed) with the min-max range, per stage.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    from omegaconf import OmegaConf
    from dflash.config import DrafterConfig, TargetConfig
    from dflash.model.drafter import DFlashDrafter, DrafterSpec
    from dflash.model.loss import Objective, drafter_loss, sample_anchors
    from dflash.model.target import Target
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    target = Target.from_config(OmegaConf.structured(TargetConfig(
        hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=768, vocab_size=args.vocab))).to(dev)
    torch.manual_seed(0)
    drafter = DFlashDrafter(DrafterSpec.from_target(
        target, OmegaConf.structured(DrafterConfig()))).to(dev)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, args.vocab - 1, (4, 512), generator=g).to(dev)
    valid = torch.ones_like(ids, dtype=torch.bool)
    mask = valid & (torch.arange(512, device=dev)[None] >= 64)
    anchors = sample_anchors(mask, valid, 64, torch.Generator(device=dev).manual_seed(1))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rows = []
    print(f"{'loss':>6} {'target ms':>18} {'drafter ms':>18} {'total ms':>10}   ({dev.type})")
    for kind in ("ce", "dpace", "kl"):
        ob = Objective(64, kind=kind, norm="batch")
        times = []
        for rep in range(args.reps + 1):
            sync()
            t0 = time.perf_counter()
            ctx = target.context(ids, valid.long(), final=kind == "kl")
            sync()
            t1 = time.perf_counter()
            out = drafter_loss(drafter, ctx, target.embed_tokens, target.lm_head_weight, ids,
                               mask, valid, ob, anchors=anchors)
            out.loss.backward()
            drafter.zero_grad(set_to_none=True)
            sync()
            t2 = time.perf_counter()
            if rep:
                times.append((1e3 * (t1 - t0), 1e3 * (t2 - t1)))
        t = np.asarray(times)
        med = np.median(t, 0)
        row = {"loss": kind, "target_ms": float(med[0]), "drafter_ms": float(med[1]),
               "target_range_ms": [float(t[:, 0].min()), float(t[:, 0].max())],
               "drafter_range_ms": [float(t[:, 1].min()), float(t[:, 1].max())]}
        rows.append(row)
        print(f"{kind:>6} {med[0]:7.1f} ({t[:, 0].min():.0f}-{t[:, 0].max():.0f}) "
              f"{med[1]:7.1f} ({t[:, 1].min():.0f}-{t[:, 1].max():.0f}) {med.sum():10.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
