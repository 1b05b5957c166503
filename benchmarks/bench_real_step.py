"""Where a training step's time goes on a real model: target forward, drafter, LM-head loss.

    make real-deps && python benchmarks/bench_real_step.py DATA_DIR [--rows 16]
        [--model DIR] [--anchors 32 64 128] [--blocks 8 16] [--repeats 3] [--bf16]
        [--draft-vocab 4096]

DATA_DIR: a data set `dflash.data.prepare` wrote for the model (e.g. the real-model
recipe's `.cache/dflash/end_to_end/smollm2/data`). One batch of its first `--rows`
samples, padded to the longest; per (anchors, block): the target's context (no grad),
the drafter forward + backward with a stand-in loss on its hidden states, and the whole
drafter step (drafter + fused LM-head cross-entropy, forward + backward). The LM head's
share is the difference (`--draft-vocab N`: the softmax over N rows). Best of `--repeats`
after one warm-up run.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout

import torch  # noqa: E402


def best(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--model")
    ap.add_argument("--anchors", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--blocks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--draft-vocab", type=int, default=0,
                    help="the training softmax over the N most supervised ids (loss.draft_vocab; "
                    "0: the whole LM head)")
    ap.add_argument("--bf16", action="store_true",
                    help="the real-model recipe's precision: target weights in bfloat16, the "
                    "drafter step under bf16 autocast")
    a = ap.parse_args()
    from omegaconf import OmegaConf

    from dflash.config import DrafterConfig, TargetConfig
    from dflash.data.format import TokenDataset
    from dflash.model.draft_vocab import DraftVocab
    from dflash.model.drafter import DFlashDrafter, DrafterSpec
    from dflash.recipe.gguf import smollm2_dir
    from dflash.model.loss import Objective, block_embeddings, drafter_loss, sample_anchors
    from dflash.model.target import Target

    repo = Path(__file__).resolve().parents[1]
    path = Path(a.model) if a.model else smollm2_dir(repo / ".cache" / "dflash")
    target = Target.from_config(OmegaConf.structured(TargetConfig(
        path=str(path), dtype="bfloat16" if a.bf16 else "float32"))).eval()
    ds = TokenDataset.open(a.data)
    vocab = DraftVocab.most_frequent(ds.supervised_counts(), a.draft_vocab) if a.draft_vocab else None
    rows = [ds.sample(i) for i in range(min(a.rows, len(ds)))]
    s = max(len(t) for t, _ in rows)
    ids = torch.zeros(len(rows), s, dtype=torch.long)
    mask = torch.zeros(len(rows), s, dtype=torch.bool)
    valid = torch.zeros_like(mask)
    for r, (t, m) in enumerate(rows):
        ids[r, :len(t)] = torch.tensor(t)
        mask[r, :len(t)] = torch.tensor(m, dtype=torch.bool)
        valid[r, :len(t)] = True
    real = int(valid.sum())
    cast = (torch.autocast("cpu", dtype=torch.bfloat16) if a.bf16 else contextlib.nullcontext())
    t_target = best(lambda: target.context(ids, valid.long()), a.repeats)
    ctx = target.context(ids, valid.long())
    print(f"{path.name}: {len(rows)} rows x {s} (real {real} tokens), {torch.get_num_threads()} "
          f"threads; target forward {t_target:.2f} s ({real / t_target:.0f} tok/s)")
    print(f"{'anchors':>8} {'block':>6} {'drafter f+b':>12} {'+ LM-head CE':>13} {'LM head share':>14}"
          f" {'step est.':>10}")
    for bs in a.blocks:
        for n in a.anchors:
            torch.manual_seed(0)
            d = DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(
                DrafterConfig(num_layers=1, block_size=bs, num_anchors=n))))
            ob = Objective(n, vocab=vocab)
            anchors = sample_anchors(mask, valid, n, torch.Generator().manual_seed(1))

            def drafter_only():
                emb = block_embeddings(target.embed_tokens, ids, anchors[0], bs,
                                       d.spec.mask_token_id)
                h = d(ctx, valid, anchors[0], anchors[1], emb)
                h.float().pow(2).mean().backward()
                d.zero_grad(set_to_none=True)

            def full():
                out = drafter_loss(d, ctx, target.embed_tokens, target.lm_head_weight, ids,
                                   mask, valid, ob, anchors=anchors)
                out.loss.backward()
                d.zero_grad(set_to_none=True)

            with cast:
                t_d, t_f = best(drafter_only, a.repeats), best(full, a.repeats)
            print(f"{n:8d} {bs:6d} {t_d:11.2f}s {t_f:12.2f}s {100 * (t_f - t_d) / t_f:13.0f}%"
                  f" {t_target + t_f:9.2f}s", flush=True)


if __name__ == "__main__":
    main()
