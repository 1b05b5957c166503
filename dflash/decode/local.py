"""Generation with a local target: batched, KV-cached, finished rows leave the batch.

Greedy decoding runs through dflash's speculative decoder (`dflash.decode`): with a
trained dflash drafter (`drafter=DIR`) it drafts whole blocks; without one `decoding`
picks plain decoding (one token a step), prompt lookup (the continuation of the latest
earlier match of the last tokens, cheap and useful on replies that quote their prompt)
or, by default, whichever of the two gives more tokens/s as measured while it runs
(`dflash.decode.adaptive`). All are lossless: the output is the target's own greedy
decoding (tested). Sampling (temperature > 0, top-p) runs HF
`generate`, seeded per batch so a rerun of a batch writes the same text.

`model.compile=static|dynamic` takes transformers' compiled path for plain decoding
(greedy or sampled): a static KV cache and a torch.compile'd decode step (CUDA graphs
under inductor on GPU). Under `static` prompt widths are rounded up to
`batching.pad_to_multiple`, so a run meets a bounded set of cache shapes (widths x batch
sizes) instead of one per batch; finished rows stay in the batch as padding, the price
of a fixed shape.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash.decode.adaptive import AdaptiveProposer
from dflash.decode.backend import Sampling
from dflash.decode.drafter import DrafterProposer
from dflash.decode.history import PromptLookupProposer
from dflash.decode.proposer import PlainProposer, Proposer
from dflash.decode.speculative import speculative_decode
from dflash.options import choice

DECODINGS = {"plain": PlainProposer, "lookup": PromptLookupProposer,
             "auto": lambda: AdaptiveProposer(PromptLookupProposer())}


@dataclass(frozen=True)
class Compiled:
    """`model.compile`: transformers' compiled decode step over a static KV cache."""
    backend: str  # the torch.compile backend
    dynamic: bool = False
    pad_to_multiple: int = 64  # static: prompt widths round up to this (bounded shapes)


def greedy_proposer(target, drafter=None, decoding: str = "auto",
                    confidence_stop: float = 0.0) -> Proposer:
    """Greedy decoding's proposer: the drafter's where one is given, else by `decoding`
    (plain | lookup | auto). One object for a whole run, so auto's measurements carry
    over from batch to batch."""
    if drafter is not None:
        return DrafterProposer(drafter, target, confidence_stop=confidence_stop)
    return DECODINGS[decoding]()


class LocalBackend:
    takes_messages = False  # prompts go as token ids; replies come back as ids

    @classmethod
    def from_config(cls, cfg, target, stop_ids, drafter=None, tok=None, pad_id: int = 0,
                    compile_backend: str | None = None,
                    decoding: str | None = None) -> "LocalBackend":
        """From regenerate's config: sampling keys, model.compile, batching rounding;
        `decoding` overrides the config's."""
        compiled = None if compile_backend is None else Compiled(
            compile_backend, choice(cfg.model.compile) == "dynamic",
            int(cfg.batching.pad_to_multiple))
        proposer = greedy_proposer(target, drafter, decoding or choice(cfg.decoding),
                                   float(cfg.get("confidence_stop", 0.0)))
        return cls(target, stop_ids, Sampling.from_config(cfg), proposer, tok, compiled, pad_id)

    def __init__(self, target, stop_ids, sampling: Sampling = Sampling(),
                 proposer: Proposer | None = None, tok=None, compiled: Compiled | None = None,
                 pad_id: int = 0):
        self.target, self.stop = target, sorted(set(int(i) for i in stop_ids))
        self.sampling, self.tok, self.compiled = sampling, tok, compiled
        self.proposer = proposer if proposer is not None else greedy_proposer(target)
        self.pad_id = int(pad_id)

    def generate(self, requests: list, batch_index: int = 0) -> list[dict]:
        """Replies to `requests` (their `prompt_ids`): the ids themselves travel on beside
        the text (decoding then re-tokenizing the text is not token-exact: merges differ,
        invalid UTF-8 becomes U+FFFD)."""
        outs = self.decode_ids([r.prompt_ids for r in requests], batch_index)
        return [{"key": r.key, "text": self.tok.decode(o["ids"], skip_special_tokens=False),
                 "finish_reason": o["finish_reason"], "tokens": o["tokens"],
                 "prompt_ids": r.prompt_ids, "ids": o["ids"], "stop_id": o.get("stop_id")}
                for r, o in zip(requests, outs)]

    def decode_ids(self, prompts: list, batch_index: int = 0) -> list[dict]:
        """Per prompt (token ids): generated token ids (stop token excluded), finish reason
        ("stop" or "length"), the tokens generated (the stop token included) and, when
        it stopped, the stop token's id."""
        s = self.sampling
        if self.compiled is not None:
            outs = self._hf_generate(prompts, batch_index, sample=s.temperature > 0)
        elif s.temperature <= 0:
            outs = speculative_decode(self.target, self.proposer, prompts, s.max_new_tokens,
                                      eos_token_id=self.stop or None,
                                      batch_size=len(prompts)).tokens
        else:
            outs = self._hf_generate(prompts, batch_index, sample=True)
        return [self._finish(list(map(int, t))) for t in outs]

    @property
    def decoding(self) -> str:
        """How greedy decoding runs (auto: and what it chose)."""
        if self.compiled is not None or self.sampling.temperature > 0:
            return "hf generate" + (" (compiled)" if self.compiled else ", sampled")
        return self.proposer.name

    def _finish(self, toks: list) -> dict:
        stop = set(self.stop)
        for i, t in enumerate(toks):
            if t in stop:
                return {"ids": toks[:i], "finish_reason": "stop", "tokens": i + 1, "stop_id": t}
        cap = self.sampling.max_new_tokens
        return {"ids": toks[:cap], "finish_reason": "length", "tokens": min(len(toks), cap)}

    @torch.no_grad()
    def _hf_generate(self, prompts: list, batch_index: int, sample: bool) -> list:
        lm = self.target.lm
        dev = self.target.lm_head_weight.device
        width = max(len(p) for p in prompts)
        kw: dict = {}
        c, s = self.compiled, self.sampling
        if c is not None:
            from transformers import CompileConfig
            pad = 1 if c.dynamic else max(1, c.pad_to_multiple)
            width = -(-width // pad) * pad
            cc = CompileConfig(backend=c.backend, fullgraph=False, dynamic=c.dynamic,
                               mode="reduce-overhead" if c.backend == "inductor"
                               and dev.type == "cuda" else None)
            # transformers compiles on accelerators only unless told; asked for, do it here too
            cc._compile_all_devices = True
            kw = {"cache_implementation": "static", "compile_config": cc}
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long, device=dev)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):  # left padding: every row's next token at the end
            ids[r, width - len(p):] = torch.as_tensor(p, device=dev)
            mask[r, width - len(p):] = 1
        if sample:
            torch.manual_seed(s.seed * 1_000_003 + batch_index)
            kw.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=None)
        else:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        out = lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=s.max_new_tokens,
                          eos_token_id=self.stop or None, pad_token_id=self.pad_id, **kw)
        return [row[width:].tolist() for row in out]
