"""The `eval` section's schema (acceptance during a run) and the eval app's prompt formats."""
from __future__ import annotations

from dataclasses import dataclass

from dflash.data.prompt_formats import FORMATS as PROMPT_FORMATS
from dflash.options import options

PromptFormat = options("PromptFormat", ("prompt_ids", *PROMPT_FORMATS))


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
