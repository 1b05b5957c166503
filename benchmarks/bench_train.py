"""Real tokens/s of the training step for every batching strategy, on the default world.

    python benchmarks/bench_train.py [--steps 40] [--json rows.json] [override ...]

One process builds the world once (cached), then for each strategy plans epoch 0 and
times `--steps` real training steps (target context + drafter step) after a few warm
ones. Tokens/s counts real tokens; with a fixed step cost per padded token, tokens/s
should track padding efficiency, which the tok/s-per-efficiency column checks (it stays
about constant when it does). `attn x` is the target's attention work under a dense
kernel (rows x padded length^2) over what the documents need (sum of length^2): packed
rows pay it with HF sdpa, which masks across documents inside one dense row;
`model.target.attn_implementation=flash_attention_2` or `flex_attention` skip that work
on GPU. The drafter does not pay it: on CPU its chunked attention reads only the context
window its blocks can see, on GPU the flex block mask skips cross-document tiles.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests.helpers


from dflash.config import compose  # noqa: E402
from dflash.trainer import Trainer  # noqa: E402
from tests.helpers.batches import collate  # noqa: E402

SETTINGS = [("sorted", 0), ("random", 0), ("bucketed", 0), ("bucketed", 4), ("megabatch", 4),
            ("packed", 0)]


def time_strategy(strategy: str, window: int, steps: int, warm: int, overrides) -> dict:
    cfg = compose("train", [f"batching={strategy}", f"batching.sort_window={window}",
                            "eval.enabled=false", "logger.progress=false", *overrides])
    r = Trainer(cfg, "/tmp/dflash-bench-train").build()
    batches = list(r.shard(0).batches())
    run = batches[:warm] + batches[warm:warm + steps]
    real = padded = attn_dense = attn_docs = 0
    lengths = r.sources.data.lengths
    for i, batch in enumerate(run):
        if i == warm:
            t0 = time.perf_counter()
        b = collate(r.dataset, batch, r.topo.target_device)
        m = r.train_step(b)
        if i >= warm:
            real += batch.num_tokens
            padded += batch.padded_tokens
            attn_dense += batch.num_rows * batch.seq_len ** 2
            attn_docs += int((lengths[batch.sample_ids].astype(float) ** 2).sum())
    float(m["loss"])  # wait for the device
    sec = time.perf_counter() - t0
    return {"strategy": strategy, "sort_window": window, "tokens_per_second": real / sec,
            "padded_tokens_per_second": padded / sec, "padding_efficiency": real / padded,
            "steps": len(run) - warm, "plan_efficiency": r.shard(0).padding_efficiency,
            "attention_overhead": attn_dense / max(1, attn_docs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    rows = [time_strategy(s, w, a.steps, a.warm, a.overrides) for s, w in SETTINGS]
    print(f"{'strategy':>10} {'window':>6} {'real tok/s':>11} {'padded tok/s':>12} "
          f"{'efficiency':>10} {'tok/s / eff':>11} {'attn x':>6}")
    for r in rows:
        print(f"{r['strategy']:>10} {r['sort_window']:>6} {r['tokens_per_second']:>11,.0f} "
              f"{r['padded_tokens_per_second']:>12,.0f} {r['padding_efficiency']:>10.3f} "
              f"{r['tokens_per_second'] / r['padding_efficiency']:>11,.0f} "
              f"{r['attention_overhead']:>6.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
