"""What generates replies for regeneration: one `Backend` protocol, one sampling record.

    LocalBackend   a local target (local.py): speculative decoding when greedy (the
                   drafter, prompt lookup or plain), HF generate when sampling or compiled
    OpenAIBackend  an OpenAI-compatible server (server.py: vLLM, SGLang, llama.cpp)

A backend takes a batch of requests (each with `key`, `prompt_ids` and `messages`) and
answers one row per request: `key`, `text`, `finish_reason` (stop | length), `tokens`
generated, and what it knows besides (a local target: the token ids; a server: the
reasoning it returned, or the `error` of a request that failed after its retries).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Sampling:
    """How replies are sampled, the same for every backend."""
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    max_new_tokens: int = 512
    seed: int = 0

    @classmethod
    def from_config(cls, cfg) -> "Sampling":
        """From regenerate's config (its sampling keys)."""
        return cls(float(cfg.temperature), float(cfg.top_p), int(cfg.max_new_tokens),
                   int(cfg.seed))


class Backend(Protocol):
    # whether requests go as chat messages (a server renders the template itself) rather
    # than as the prompt token ids the tokenizer rendered here
    takes_messages: bool

    @property
    def decoding(self) -> str:
        """How replies are decoded (the regeneration report's `decoding`)."""

    def generate(self, requests: list, batch_index: int = 0) -> list[dict]:
        """One row per request, in order (see the module docstring)."""
