"""Single-prompt reference decoders for the lossless-decoding tests."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from dflash.decode import evaluate


def speculative_generate(target, drafter, prompt, max_new_tokens: int):
    """One prompt, greedy: (tokens, accept lengths) — the lossless check's subject."""
    r = evaluate(target, drafter, [prompt], max_new_tokens, batch_size=1)
    return SpecResult(r.tokens[0], r.accept_lengths[0])


@dataclass
class SpecResult:
    tokens: list
    accept_lengths: list = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        return float(np.mean(self.accept_lengths)) if self.accept_lengths else 0.0


@torch.no_grad()
def target_greedy(target, prompt, max_new_tokens: int) -> list:
    """The target's own greedy decoding (HF generate): the reference output."""
    dev = target.lm_head_weight.device
    seq = torch.as_tensor(prompt, dtype=torch.long, device=dev).view(1, -1)
    out = target.lm.generate(input_ids=seq, attention_mask=torch.ones_like(seq),
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, seq.shape[1]:].tolist()
