"""The `eval` section's schema (acceptance during a run) and the eval app's prompt formats."""
from __future__ import annotations

from dataclasses import dataclass

from dflash.data.prompt_formats import FORMATS as PROMPT_FORMATS
from dflash.errors import require
from dflash.options import options

PromptFormat = options("PromptFormat", ("prompt_ids", *PROMPT_FORMATS))


def check_eval_config(e) -> None:
    """`eval.*` that would measure nothing (no prompt, no token) while enabled."""
    if not bool(e.enabled):
        return
    require(int(e.num_prompts) >= 1, "eval.num_prompts", e.num_prompts, ">= 1 (or eval.enabled=false)")
    require(int(e.max_new_tokens) >= 1, "eval.max_new_tokens", e.max_new_tokens, ">= 1")
    require(int(e.batch_size) >= 1, "eval.batch_size", e.batch_size, ">= 1")
    require(float(e.temperature) >= 0, "eval.temperature", e.temperature, "0 (greedy) or more")
    require(int(e.every_steps) >= 0, "eval.every_steps", e.every_steps, ">= 0 (0: before and after only)")


@dataclass
class EvalConfig:
    # acceptance length by real speculative decoding on held-out prompts, before and
    # after training; the world's prompts come from a seed stream training never sees
    enabled: bool = True
    num_prompts: int = 16  # held-out prompts decoded
    max_new_tokens: int = 64  # tokens decoded per prompt
    temperature: float = 0.0  # 0: greedy; > 0: sampled (rejection rule)
    batch_size: int = 16  # prompts decoded together
    seed: int = 0  # sampling seed
    # a drafter with a confidence head (DSpark): a block stops at its first draft whose
    # confidence is below this (llama.cpp's --spec-draft-p-min); 0: every draft
    confidence_stop: float = 0.0
    every_steps: int = 0  # > 0: also measure during training (eval_curve in summary.json)
