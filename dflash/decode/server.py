"""Generation through an OpenAI-compatible server (vLLM, SGLang, llama.cpp's server).

The same requests go out as chat completions through the `openai` client (its own
timeouts and retries with backoff), at most `concurrency` in flight; the server applies
its chat template (template options go in `chat_template_kwargs`, as vLLM and SGLang
read them). A request that still fails after its retries is reported, not fatal.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from dflash.decode.backend import Sampling


class OpenAIBackend:
    takes_messages = True  # the server renders the template: requests go as messages
    decoding = "server"

    @classmethod
    def from_config(cls, cfg, tokenizer=None) -> "OpenAIBackend":
        """From regenerate's config: its `openai` section and the sampling keys."""
        return cls(cfg.openai, Sampling.from_config(cfg), dict(cfg.chat_template_kwargs),
                   tokenizer)

    def __init__(self, server, sampling: Sampling = Sampling(), template_kwargs: dict | None = None,
                 tokenizer=None):
        """`server`: base_url, model, api_key_env, concurrency, timeout, retries (the
        `openai` config section); `tokenizer` counts a reply's tokens where the server
        sends no usage."""
        self.tokenizer = tokenizer
        from openai import OpenAI
        self.client = OpenAI(base_url=server.base_url,
                             api_key=os.environ.get(server.api_key_env) or "none",
                             timeout=float(server.timeout), max_retries=int(server.retries))
        self.model, self.concurrency = server.model, max(1, int(server.concurrency))
        self.sampling, self.template_kwargs = sampling, dict(template_kwargs or {})

    def _one(self, messages: list) -> dict:
        try:
            extra = {"chat_template_kwargs": self.template_kwargs} if self.template_kwargs else None
            s = self.sampling
            r = self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=s.max_new_tokens,
                temperature=s.temperature, top_p=s.top_p, seed=s.seed, extra_body=extra)
        except Exception as exc:  # noqa: BLE001  (after the client's retries: report it)
            return {"error": f"request failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]}
        choice = (r.choices or [None])[0]
        msg = getattr(choice, "message", None)
        if msg is None:  # a reply with no choice (some servers' content filter): failed
            return {"error": "the server replied with no choices[0].message"}
        if choice.finish_reason == "content_filter":  # cut by a filter, not by the target
            return {"error": "the server's content filter stopped the reply "
                             "(finish_reason content_filter)"}
        # the thinking as `reasoning_content` (SGLang, llama.cpp, older vLLM) or
        # `reasoning` (newer vLLM, OpenRouter)
        extra = msg.model_extra or {}
        sent = (getattr(msg, "reasoning_content", None) or extra.get("reasoning_content")
                or extra.get("reasoning"))
        reasoning = sent if isinstance(sent, str) else None
        tokens = getattr(r.usage, "completion_tokens", None)
        text = msg.content or ""
        if tokens is None and self.tokenizer is not None:  # no usage sent: count them here
            said = "\n".join(x for x in (reasoning, text) if x)
            tokens = len(self.tokenizer(said, add_special_tokens=False)["input_ids"])
        # a cut reply is `length` (OpenAI, vLLM, SGLang) or `max_tokens` (some gateways)
        cut = choice.finish_reason in ("length", "max_tokens")
        return {"text": text, "reasoning": reasoning, "finish_reason": "length" if cut else "stop",
                "tokens": int(tokens or 0)}

    def generate(self, requests: list, batch_index: int = 0) -> list[dict]:
        """Replies to `requests` (their `messages`), at most `concurrency` in flight."""
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            outs = list(pool.map(self._one, [r.messages for r in requests]))
        return [{"key": r.key, **o} for r, o in zip(requests, outs)]
