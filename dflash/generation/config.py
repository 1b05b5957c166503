"""Regenerate's own sections: batching, the OpenAI-compatible server, and its options."""
from __future__ import annotations

from dataclasses import dataclass

from dflash.data.prompt_formats import FORMATS as PROMPT_FORMATS
from dflash.generation.requests import TURNS
from dflash.options import options

RegenBackend = options("RegenBackend", ("local", "openai"))
RegenDecoding = options("RegenDecoding", ("auto", "plain", "lookup"))
RegenTurns = options("RegenTurns", TURNS)
TruncatedPolicy = options("TruncatedPolicy", ("keep", "drop"))
BadLines = options("BadLines", ("skip", "error"))
ChatFormat = options("ChatFormat", PROMPT_FORMATS)


@dataclass
class RegenBatching:
    token_budget: int = 65536  # prompt + max_new_tokens summed over a batch's rows
    max_batch_size: int = 64  # prompts per batch at most
    # model.compile=static: prompt widths rounded up to this, a bounded set of cache shapes
    pad_to_multiple: int = 64


@dataclass
class OpenAISettings:
    base_url: str = "http://localhost:8000/v1"  # the server's /v1 URL
    model: str = "default"  # the served model's name
    api_key_env: str = "OPENAI_API_KEY"  # the key is read from this variable
    concurrency: int = 16  # requests in flight
    timeout: float = 120.0  # seconds per request
    retries: int = 3  # per request, with the client's backoff
