"""Train a tiny DFlash drafter on CPU and measure acceptance length before and after.

    python examples/train_tiny_drafter.py [--target-steps 300] [--drafter-steps 400]

1. builds the tiny Qwen3 target (model=tiny) and fits it to Markov-chain text, so it has
   something to say; 2. lets the target write greedy continuations of held-in prompts:
   data consistent with the target; 3. trains a 1-layer drafter on them; 4. runs real
   speculative decoding against the target on held-out prompts with the untrained and
   the trained drafter, checks both outputs equal the target's greedy decoding, and
   prints both acceptance lengths.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from dflash.config import DrafterConfig, TargetConfig  # noqa: E402
from dflash.data.synthetic import MarkovSource  # noqa: E402
from dflash.eval import acceptance_length, speculative_generate, target_greedy  # noqa: E402
from dflash.model.drafter import DFlashDrafter, DrafterSpec  # noqa: E402
from dflash.model.quick_train import fit_target_lm, greedy_continuations, train_drafter  # noqa: E402
from dflash.model.target import Target  # noqa: E402


def markov_prompts(source, n, length, seed):
    rng = np.random.default_rng(seed)
    toks, _ = source.generate(np.full(n, length), rng)
    return torch.as_tensor(toks[:, 1:])  # drop the USER marker: plain text


def run(target_steps=300, drafter_steps=400, prompt_len=16, new_tokens=80, train_prompts=384,
        eval_prompts=8, eval_tokens=48, seed=0, drafter_layers=1, progress=True):
    torch.manual_seed(seed)
    tcfg = OmegaConf.structured(TargetConfig)
    target = Target.from_config(tcfg)
    source = MarkovSource(tcfg.vocab_size, seed)
    t0 = time.time()
    lm_losses = fit_target_lm(target, markov_prompts(source, 2048, 65, seed), target_steps)
    prompts = markov_prompts(source, train_prompts + eval_prompts, prompt_len + 1, seed + 1)
    seqs = greedy_continuations(target, prompts[:train_prompts], new_tokens)
    mask = torch.zeros_like(seqs, dtype=torch.bool)
    mask[:, prompts.shape[1]:] = True  # supervise the target-written continuation
    held_out = prompts[train_prompts:]
    spec = DrafterSpec.from_target(target, OmegaConf.structured(
        DrafterConfig(num_layers=drafter_layers)))
    drafter = DFlashDrafter(spec).eval()
    before = acceptance_length(target, drafter, held_out, eval_tokens)
    log = train_drafter(drafter, target, seqs, mask, drafter_steps, seed=seed, progress=progress)
    after = acceptance_length(target, drafter, held_out, eval_tokens)
    lossless = all(speculative_generate(target, drafter, p, eval_tokens).tokens
                   == target_greedy(target, p, eval_tokens) for p in held_out[:2])
    return {"target_lm_loss": (lm_losses[0], lm_losses[-1]),
            "drafter_loss": (log.loss[0], float(np.mean(log.loss[-20:]))),
            "initial_acceptance_length": before, "acceptance_length": after,
            "lossless": lossless, "seconds": time.time() - t0, "drafter": drafter,
            "target": target}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-steps", type=int, default=300)
    ap.add_argument("--drafter-steps", type=int, default=400)
    ap.add_argument("--drafter-layers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    r = run(args.target_steps, args.drafter_steps, seed=args.seed,
            drafter_layers=args.drafter_layers)
    print(f"target LM loss      {r['target_lm_loss'][0]:.3f} -> {r['target_lm_loss'][1]:.3f}")
    print(f"drafter loss        {r['drafter_loss'][0]:.3f} -> {r['drafter_loss'][1]:.3f}")
    print(f"acceptance length   untrained {r['initial_acceptance_length']:.3f}   "
          f"trained {r['acceptance_length']:.3f}")
    print(f"lossless (output == target greedy): {r['lossless']}   [{r['seconds']:.0f} s]")
    return 0 if r["lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
