"""Generation through an OpenAI-compatible server (vLLM, SGLang, llama.cpp's server).

The same requests go out as chat completions through the `openai` client (its own
timeouts and retries with backoff), at most `concurrency` in flight; the server applies
its chat template (template options go in `chat_template_kwargs`, as vLLM and SGLang
read them). A request that still fails after its retries is reported, not fatal.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor


class OpenAIBackend:
    remote = True  # the server renders the template: requests go as messages

    @classmethod
    def from_config(cls, cfg) -> "OpenAIBackend":
        """From regenerate's config: its `openai` section and the sampling keys."""
        o = cfg.openai
        return cls(o.base_url, o.model, api_key_env=o.api_key_env, concurrency=o.concurrency,
                   timeout=o.timeout, retries=o.retries, temperature=cfg.temperature,
                   top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                   template_kwargs=dict(cfg.chat_template_kwargs), seed=cfg.seed)

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY",
                 concurrency: int = 16, timeout: float = 120.0, retries: int = 3,
                 temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 512,
                 template_kwargs: dict | None = None, seed: int = 0):
        from openai import OpenAI
        self.client = OpenAI(base_url=base_url, api_key=os.environ.get(api_key_env) or "none",
                             timeout=float(timeout), max_retries=int(retries))
        self.model, self.concurrency = model, max(1, int(concurrency))
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.max_new_tokens, self.seed = int(max_new_tokens), int(seed)
        self.template_kwargs = dict(template_kwargs or {})

    def _one(self, messages: list) -> dict:
        try:
            extra = {"chat_template_kwargs": self.template_kwargs} if self.template_kwargs else None
            r = self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=self.max_new_tokens,
                temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                extra_body=extra)
        except Exception as exc:  # noqa: BLE001  (after the client's retries: report it)
            return {"error": f"request failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]}
        choice = r.choices[0]
        msg = choice.message
        reasoning = getattr(msg, "reasoning_content", None) or (msg.model_extra or {}).get("reasoning_content")
        tokens = r.usage.completion_tokens if r.usage is not None else None
        return {"text": msg.content or "", "reasoning": reasoning,
                "finish_reason": "length" if choice.finish_reason == "length" else "stop",
                "tokens": int(tokens or 0)}

    def generate_messages(self, conversations: list) -> list[dict]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(self._one, conversations))
