"""Regenerate's greedy decodings on a real chat model, on the same batches: HF `generate`,
plain (one token a step), prompt lookup (blocks of 4), auto (the default) and, with
--drafter, a trained dflash drafter (regenerate's `drafter=DIR`).

    make real-deps && python benchmarks/bench_regenerate_real.py [--prompts 48] [--max-new 96]
        [--model DIR] [--drafter DIR] [--json PATH]

The prompts are the project's prompt set (`dflash.recipe.prompt_gen`, seed 1) rendered with
the model's chat template; the batches are regenerate's own plan (`plan_batches`, the
default token budget and batch cap, or --cap). Each decoding runs through regenerate's
local backend; every output is compared token for token with HF greedy `generate` on the
same batch. Default model: SmolLM2-135M-Instruct from its pip package.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout

import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--cap", type=int, default=64, help="rows per batch (regenerate's default)")
    ap.add_argument("--model")
    ap.add_argument("--drafter", help="a trained drafter of this model (train-*/drafter)")
    ap.add_argument("--dtype", default="float32", help="the target's weights (bfloat16: half the "
                    "bytes a decode step reads; its own greedy replies, compared with HF's in it)")
    ap.add_argument("--only", help="comma-separated decodings to run (default: all)")
    ap.add_argument("--json")
    a = ap.parse_args()
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from dflash.recipe.gguf import smollm2_dir
    from dflash.config import TargetConfig
    from dflash.data.loss_mask import end_of_turn_ids
    from dflash.recipe.prompt_gen import prompt_set
    from dflash.decode.backend import Sampling
    from dflash.decode.local import LocalBackend, greedy_proposer
    from dflash.generation.runner import plan_batches
    from dflash.model.checkpoint import load_drafter
    from dflash.model.target import Target

    repo = Path(__file__).resolve().parents[1]
    path = Path(a.model) if a.model else smollm2_dir(repo / ".cache" / "dflash")
    tok = AutoTokenizer.from_pretrained(str(path))
    target = Target.from_config(OmegaConf.structured(TargetConfig(path=str(path), dtype=a.dtype))).eval()
    prompts = []
    for p in prompt_set(a.prompts, 1):
        ids = tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    stop = sorted(set(end_of_turn_ids(tok)) | {int(tok.eos_token_id)})
    batches = plan_batches([SimpleNamespace(prompt_ids=p) for p in prompts], a.max_new,
                           65536, a.cap)
    print(f"{path.name}: {len(prompts)} prompts in {len(batches)} batches "
          f"({[len(b) for b in batches]} rows), max_new_tokens {a.max_new}, "
          f"{torch.get_num_threads()} threads", flush=True)
    rows, ref = [], None
    with torch.no_grad():
        drafter = load_drafter(a.drafter).eval() if a.drafter else None
        names = ("hf generate", "plain", "lookup", "auto") + (("drafter",) if drafter else ())
        chosen = {"hf generate", *a.only.split(",")} if a.only else set(names)  # HF: the reference
        for name in [n for n in names if n in chosen]:
            # a drafter, when given, is the proposer whatever `decoding` says
            be = LocalBackend(target, stop, Sampling(max_new_tokens=a.max_new), greedy_proposer(
                target, drafter if name == "drafter" else None,
                name if name in ("plain", "lookup") else "auto"))
            t0, out = time.perf_counter(), {}
            for bi, idx in enumerate(batches):
                batch = [prompts[i] for i in idx]
                res = ([be._finish(list(map(int, t))) for t in be._hf_generate(batch, bi, False)]
                       if name == "hf generate" else be.decode_ids(batch, bi))
                out.update({i: r for i, r in zip(idx, res)})
            sec = time.perf_counter() - t0
            toks = sum(r["tokens"] for r in out.values())
            ids = [out[i]["ids"] for i in range(len(prompts))]
            ref = ids if ref is None else ref  # HF generate's, the first
            rows.append(dict(decoding=name if name in ("hf generate", "drafter") else be.decoding,
                             seconds=sec, tokens=toks, tokens_per_second=toks / sec,
                             equal_to_hf_greedy=sum(x == y for x, y in zip(ids, ref)),
                             rows=len(ids)))
            hf = rows[0]["tokens_per_second"]
            print("{decoding:>16}: {tokens:6d} tokens in {seconds:6.1f} s = "
                  "{tokens_per_second:6.1f} tok/s".format(**rows[-1])
                  + f" ({rows[-1]['tokens_per_second'] / hf:.2f}x HF), "
                  f"{rows[-1]['equal_to_hf_greedy']}/{len(ids)} rows equal to HF greedy", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
