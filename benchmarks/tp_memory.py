"""Target memory per rank under topology.target_tp, computed from published model sizes.

    python benchmarks/tp_memory.py [--dtype-bytes 2]

Per rank: the decoder layers / k (transformers' TP plan shards every attention and MLP
projection; norms are replicated and negligible), the input embedding (not in the plan:
replicated), the LM head / k (sharded by the plan) plus the full plain copy of the LM
head the drafter's loss reads (dflash/model/tp_target.py). The drafter, its optimizer
state and the activations come on top, the same with or without TP.
"""
from __future__ import annotations

import argparse

# name: (hidden, layers, intermediate, heads, kv heads, head dim, vocab, tied embeddings)
PUBLISHED = {
    "Qwen3-8B": (4096, 36, 12288, 32, 8, 128, 151936, False),
    "Qwen3-32B": (5120, 64, 25600, 64, 8, 128, 151936, False),
    "Llama-3.1-70B": (8192, 80, 28672, 64, 8, 128, 128256, False),
}


def per_rank_gib(sizes, k: int, nbytes: int) -> dict:
    h, n, inter, heads, kv, hd, vocab, tied = sizes
    attn = h * heads * hd * 2 + h * kv * hd * 2  # q, o; k, v
    layers = n * (attn + 3 * h * inter)
    embed = vocab * h
    head = 0 if tied else vocab * h
    if k == 1:
        target = layers + embed + head
    else:
        target = layers / k + embed + head / k + vocab * h  # + the plain head copy
    gib = 1024 ** 3
    return {"params_b": (layers + embed + head) / 1e9, "target_gib": target * nbytes / gib}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype-bytes", type=int, default=2, help="2: bf16")
    a = ap.parse_args()
    tps = (1, 2, 4, 8)
    print(f"{'target':>14} {'params':>8}  " + "  ".join(f"{'TP=' + str(k):>8}" for k in tps)
          + "   (GiB of target weights per rank)")
    for name, sizes in PUBLISHED.items():
        h, n, _, heads, kv, *_ = sizes
        cells = []
        for k in tps:
            ok = heads % k == 0 and kv % k == 0
            cells.append(f"{per_rank_gib(sizes, k, a.dtype_bytes)['target_gib']:8.1f}" if ok
                         else f"{'-':>8}")
        print(f"{name:>14} {per_rank_gib(sizes, 1, 2)['params_b']:7.1f}B  " + "  ".join(cells))


if __name__ == "__main__":
    main()
