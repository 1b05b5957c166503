"""What a drafter buys in wall-clock time: greedy decoding at batch 1 (where speculative
decoding pays: the target's forward is memory-bound there on a GPU), each prompt decoded
plainly (one target forward a token, the same KV-cached session) and with the drafter,
timed on this machine, outputs compared (greedy is lossless).

Per prompt: tokens/s of each; over prompts: total tokens / total seconds of each, the
speedup (drafter over plain) with a paired 95% bootstrap interval over prompts. The two
decoders alternate prompt by prompt, so a machine slowing down mid-run moves both.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from dflash.decode import DrafterProposer, PlainProposer, speculative_decode


def _timed(target, proposer, prompt, max_new_tokens: int, eos) -> tuple[list, float, int]:
    t0 = time.perf_counter()
    r = speculative_decode(target, proposer, [prompt], max_new_tokens, eos_token_id=eos,
                           batch_size=1)
    return r.tokens[0], time.perf_counter() - t0, len(r.accept_lengths[0])


def ratio_interval(num_tok, num_s, den_tok, den_s, draws: int = 2000, seed: int = 0) -> dict:
    """(sum num_tok / sum num_s) / (sum den_tok / sum den_s) and its paired 95%
    bootstrap interval over the prompts."""
    arrs = [np.asarray(x, dtype=np.float64) for x in (num_tok, num_s, den_tok, den_s)]
    n = len(arrs[0])
    pick = np.random.default_rng(seed).integers(0, n, (draws, n))

    def ratio(idx):
        a, b, c, d = (x[idx].sum(-1) for x in arrs)
        return (a / b) / (c / d)
    lo, hi = np.percentile(ratio(pick), [2.5, 97.5])
    return {"value": float(ratio(np.arange(n))), "lo": float(lo), "hi": float(hi)}


def measure_speed(target, drafter, prompts, max_new_tokens: int, eos_token_id=None) -> dict:
    """Batch-1 greedy tokens/s, plain and with `drafter`, on this machine."""
    was_training = drafter.training
    drafter.eval()
    proposers = {"plain": PlainProposer(), "drafter": DrafterProposer(drafter, target)}
    try:
        for p in proposers.values():  # first-call costs (allocations, kernels) untimed
            _timed(target, p, prompts[0], min(8, max_new_tokens), eos_token_id)
        runs = {k: [] for k in proposers}
        for i, prompt in enumerate(prompts):
            order = list(proposers) if i % 2 == 0 else list(proposers)[::-1]
            for name in order:
                runs[name].append(_timed(target, proposers[name], prompt, max_new_tokens,
                                         eos_token_id))
    finally:
        drafter.train(was_training)
    tok = {k: [len(t) for t, _, _ in v] for k, v in runs.items()}
    sec = {k: [s for _, s, _ in v] for k, v in runs.items()}
    steps = [n for _, _, n in runs["drafter"]]
    return {
        "batch_size": 1, "threads": torch.get_num_threads(), "prompts": len(prompts),
        "device": str(target.lm_head_weight.device),
        "plain_tokens_per_second": sum(tok["plain"]) / sum(sec["plain"]),
        "drafter_tokens_per_second": sum(tok["drafter"]) / sum(sec["drafter"]),
        "speedup": ratio_interval(tok["drafter"], sec["drafter"], tok["plain"], sec["plain"]),
        "acceptance_length": sum(tok["drafter"]) / max(1, sum(steps)),
        "outputs_equal": [t for t, _, _ in runs["plain"]] == [t for t, _, _ in runs["drafter"]],
        "per_prompt": [{"plain_tokens_per_second": a / b, "drafter_tokens_per_second": c / d}
                       for a, b, c, d in zip(tok["plain"], sec["plain"], tok["drafter"],
                                             sec["drafter"])]}


def format_speed(s: dict) -> str:
    sp = s["speedup"]
    return (f"wall clock, batch 1, {s['threads']} thread(s) on {s['device']}, {s['prompts']} "
            f"prompts: plain {s['plain_tokens_per_second']:.1f} tok/s, drafter "
            f"{s['drafter_tokens_per_second']:.1f} tok/s (acceptance {s['acceptance_length']:.2f}"
            f"): speedup {sp['value']:.2f}x (95% CI {sp['lo']:.2f} to {sp['hi']:.2f}); "
            f"outputs equal: {s['outputs_equal']}")
