"""Regeneration throughput: length-planned batches vs one prompt at a time vs unsorted
batches, each with plain greedy decoding, prompt-lookup drafts and a trained dflash drafter.

    python benchmarks/bench_regenerate.py [--prompts 64] [--max-new 32] [--train-steps 300]
                                          [--json out.json] [override ...]

The target and the prompts are the default world's (its fitted tiny target, held-out
prompts training never saw); overrides go to the train config (`topology=single_gpu
model.target.dtype=bfloat16` on a GPU). Generation runs through regenerate's own local
backend (`dflash.decode.local.LocalBackend`) and its batch planner
(`dflash.generation.runner.plan_batches`). The drafter is trained first, in this process,
for `--train-steps` steps of the default run (0: no drafter rows). Every row is checked
against plain greedy one-prompt-at-a-time decoding: greedy is lossless, so the outputs
must agree token for token (a bf16 target may differ where a batch's padding moves a
near-tie; the count says so). Each figure is one measurement, with the best of
`--repeats` runs: tokens/s on a shared machine drifts.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # a checkout
os.environ.setdefault("WANDB_MODE", "disabled")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dflash.config import compose  # noqa: E402
from dflash.decode import DrafterProposer  # noqa: E402
from dflash.decode import PromptLookupProposer  # noqa: E402
from dflash.decode.backend import Sampling  # noqa: E402
from dflash.decode.local import LocalBackend  # noqa: E402
from dflash.generation.runner import plan_batches  # noqa: E402

QUIET = ["logger.progress=false"]


def batchings(prompts: list, max_new: int, budget: int, cap: int) -> dict:
    """Index lists per batching: one at a time, unsorted fixed-size chunks, planned."""
    n = len(prompts)
    order = np.random.default_rng(0).permutation(n).tolist()
    reqs = [SimpleNamespace(prompt_ids=p) for p in prompts]  # what plan_batches reads
    return {"one at a time": [[i] for i in range(n)],
            "unsorted": [order[i:i + cap] for i in range(0, n, cap)],
            "planned": plan_batches(reqs, max_new, budget, cap)}


def generate(backend, prompts: list, batches: list) -> tuple[list, float, int]:
    out = [None] * len(prompts)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for bi, idx in enumerate(batches):
        for i, row in zip(idx, backend.decode_ids([prompts[i] for i in idx], bi)):
            out[i] = row["ids"]
    sync()
    return out, time.perf_counter() - t0, sum(len(o) for o in out if o is not None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()

    from dflash.trainer import Trainer
    cfg = compose("train", [*QUIET, f"eval.num_prompts={a.prompts}", "eval.enabled=false",
                            f"optim.max_steps={max(1, a.train_steps)}", *a.overrides])
    tr = Trainer(cfg, tempfile.mkdtemp()).build()
    if a.train_steps > 0:
        t0 = time.perf_counter()
        s = tr.run()
        print(f"drafter: {s['steps']} steps in {time.perf_counter() - t0:.0f} s", flush=True)
    target, prompts = tr.target.eval(), [list(map(int, p)) for p in tr.sources.eval_prompts]
    budget, cap = int(cfg.batching.token_budget), int(cfg.batching.max_batch_size)
    proposers = {"plain": PromptLookupProposer(block_size=1),  # no drafts: one token a step
                 "prompt lookup": PromptLookupProposer()}
    if a.train_steps > 0:
        proposers["dflash drafter"] = DrafterProposer(tr.drafter.eval(), target)
    dev = target.lm_head_weight.device
    print(f"{len(prompts)} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), "
          f"{a.max_new} new tokens each, batch cap {cap}, token budget {budget}, target "
          f"{target.lm_head_weight.dtype} on {dev}", flush=True)
    rows, ref = [], None
    with torch.no_grad():
        for pname, prop in proposers.items():
            backend = LocalBackend(target, [], Sampling(max_new_tokens=a.max_new), prop)
            for bname, batches in batchings(prompts, a.max_new, budget, cap).items():
                generate(backend, prompts, batches[:1])  # warm the kernels of this path
                best = None
                for _ in range(a.repeats):
                    out, sec, toks = generate(backend, prompts, batches)
                    best = sec if best is None else min(best, sec)
                ref = out if ref is None else ref
                same = sum(x == y for x, y in zip(out, ref))
                rows.append({"proposer": pname, "batching": bname, "batches": len(batches),
                             "tokens": toks, "seconds": best, "tokens_per_second": toks / best,
                             "rows_equal_to_plain": same, "rows": len(out)})
                r = rows[-1]
                print(f"{pname:>15} {bname:>14}: {r['batches']:4d} batches, "
                      f"{r['tokens_per_second']:9,.0f} tok/s ({best:.2f} s), "
                      f"{same}/{len(out)} rows equal to plain one-at-a-time", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": str(dev), "dtype": str(target.lm_head_weight.dtype),
                       "max_new_tokens": a.max_new, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
