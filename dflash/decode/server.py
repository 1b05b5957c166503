"""Generation through an OpenAI-compatible server (vLLM, SGLang, llama.cpp's server).

The same requests go out as chat completions through the `openai` client (its own
timeouts and retries with backoff), at most `concurrency` in flight; the server applies
its chat template (template options go in `chat_template_kwargs`, as vLLM and SGLang
read them). A request that still fails after its retries is reported, not fatal; a
server that does not answer at all is: at start (`check_server`, which also finds the
model among those served) and when every request of a batch found no server.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor

from dflash.decode.backend import Sampling
from dflash.errors import ConfigError, DataError, one_line

log = logging.getLogger("dflash.regenerate")


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
        self.url, self.key_env = str(server.base_url), str(server.api_key_env)

    def check_server(self) -> None:
        """At start, before any request: a server answers at `base_url`, takes the key,
        and serves `model` (one line naming what is wrong). A server without a model
        list (an HTTP error other than 401/403 on GET /models, a body that is not one) is
        let through; a model it does not list is refused only when a one-token request
        under its name is refused as not found (llama.cpp's server answers any name)."""
        import openai
        try:
            served = [m.id for m in self.client.models.list()]
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise ConfigError(f"openai.base_url={self.url} refused the API key (HTTP "
                              f"{exc.status_code}): set ${self.key_env} (openai.api_key_env)") from None
        except openai.APIConnectionError as exc:
            raise ConfigError(f"openai.base_url={self.url}: no server answers there "
                              f"({one_line(exc, 120)}); start it or fix the URL") from None
        except Exception as exc:  # noqa: BLE001  (an HTTP error, a body that is no model list)
            log.info("%s lists no models (%s: %s): openai.model=%s not checked", self.url,
                     type(exc).__name__, one_line(exc, 80), self.model)
            return
        if not served or self.model in served:
            return
        # not listed: some servers answer any name (llama.cpp's serves its one model
        # whatever a request names), so one token asked under it decides
        try:
            self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        except openai.NotFoundError:
            shown = ", ".join(served[:8]) + (f" (+{len(served) - 8} more)" if len(served) > 8 else "")
            raise ConfigError(f"openai.model={self.model} is not served at {self.url}; it "
                              f"serves {shown}") from None
        except Exception:  # noqa: BLE001  (another refusal: the requests will say theirs)
            return

    def _one(self, messages: list) -> dict:
        try:
            extra = {"chat_template_kwargs": self.template_kwargs} if self.template_kwargs else None
            s = self.sampling
            r = self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=s.max_new_tokens,
                temperature=s.temperature, top_p=s.top_p, seed=s.seed, extra_body=extra)
        except Exception as exc:  # noqa: BLE001  (after the client's retries: report it)
            from openai import APIConnectionError, APITimeoutError
            gone = isinstance(exc, APIConnectionError) and not isinstance(exc, APITimeoutError)
            return {"error": f"request failed: {type(exc).__name__}: {exc}".splitlines()[0][:300],
                    "no_server": gone}
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
        if outs and all(o.get("no_server") for o in outs):
            # the server went away: stop rather than mark every prompt left failed; the
            # batches written so far are kept, and the same command goes on from them
            raise DataError(f"openai.base_url={self.url} stopped answering: all {len(outs)} "
                            f"requests of batch {batch_index} found no server "
                            f"({outs[0]['error']}); rerun the same command once it is back "
                            "to go on")
        return [{"key": r.key, **{k: v for k, v in o.items() if k != "no_server"}}
                for r, o in zip(requests, outs)]
