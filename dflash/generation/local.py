"""Generation with a local target: batched, KV-cached, finished rows leave the batch.

Greedy decoding runs through dflash's speculative decoder (`dflash.eval.decode`): with a
trained dflash drafter (`drafter=DIR`) it drafts whole blocks; without one `decoding`
picks plain decoding (one token a step), prompt lookup (the continuation of the latest
earlier match of the last tokens, cheap and useful on replies that quote their prompt)
or, by default, whichever of the two gives more tokens/s as measured while it runs
(`dflash.generation.adaptive`). All are lossless: the output is the target's own greedy
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

import torch

from dflash.eval.decode import DrafterProposer, PromptLookupProposer, speculative_decode
from dflash.generation.adaptive import AdaptiveProposer
from dflash.options import choice


class LocalBackend:
    remote = False  # prompts go as token ids; replies come back as ids

    @classmethod
    def from_config(cls, cfg, target, stop_ids, drafter=None, pad_id: int = 0,
                    compile_backend: str | None = None,
                    decoding: str | None = None) -> "LocalBackend":
        """From regenerate's config: sampling keys, model.compile, batching rounding;
        `decoding` overrides the config's."""
        return cls(target, stop_ids, temperature=cfg.temperature, top_p=cfg.top_p,
                   max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, drafter=drafter,
                   pad_id=pad_id, compile_backend=compile_backend,
                   dynamic=choice(cfg.model.compile) == "dynamic",
                   pad_to_multiple=int(cfg.batching.pad_to_multiple),
                   decoding=decoding or choice(cfg.decoding),
                   confidence_stop=float(cfg.get("confidence_stop", 0.0)))

    def __init__(self, target, stop_ids, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 512, seed: int = 0, drafter=None, pad_id: int = 0,
                 proposer=None, compile_backend: str | None = None, dynamic: bool = False,
                 pad_to_multiple: int = 64, decoding: str = "auto",
                 confidence_stop: float = 0.0):
        self.target, self.stop = target, sorted(set(int(i) for i in stop_ids))
        # greedy proposer: given, else the drafter's, else by `decoding`; one object for
        # the whole run, so auto's measurements carry over from batch to batch
        if proposer is None and drafter is not None:
            proposer = DrafterProposer(drafter, target, confidence_stop=confidence_stop)
        elif proposer is None:
            proposer = {"plain": lambda: PromptLookupProposer(block_size=1),
                        "lookup": PromptLookupProposer,
                        "auto": lambda: AdaptiveProposer(PromptLookupProposer())}[decoding]()
        self.proposer = proposer
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.max_new_tokens, self.seed = int(max_new_tokens), int(seed)
        self.pad_id = int(pad_id)
        self.compile_backend, self.dynamic = compile_backend, bool(dynamic)
        self.pad_to_multiple = 1 if dynamic else max(1, int(pad_to_multiple))

    def generate(self, prompts: list, batch_index: int = 0) -> list[dict]:
        """Per prompt: generated token ids (stop token excluded), finish reason
        ("stop" or "length"), the tokens generated (the stop token included) and, when
        it stopped, the stop token's id."""
        if self.compile_backend is not None:
            outs = self._hf_generate(prompts, batch_index, sample=self.temperature > 0)
        elif self.temperature <= 0:
            res = speculative_decode(self.target, self.proposer, prompts, self.max_new_tokens,
                                     eos_token_id=self.stop or None, batch_size=len(prompts))
            outs = res.tokens
        else:
            outs = self._hf_generate(prompts, batch_index, sample=True)
        return [self._finish(list(map(int, t))) for t in outs]

    @property
    def decoding(self) -> str:
        """How greedy decoding runs (auto: and what it chose)."""
        if self.compile_backend is not None or self.temperature > 0:
            return "hf generate" + (" (compiled)" if self.compile_backend else ", sampled")
        p = self.proposer
        if isinstance(p, AdaptiveProposer):
            return f"auto ({p.choice})"
        if isinstance(p, DrafterProposer):
            return "drafter"
        return "plain" if p.block_size == 1 else "lookup"

    def _finish(self, toks: list) -> dict:
        stop = set(self.stop)
        for i, t in enumerate(toks):
            if t in stop:
                return {"ids": toks[:i], "finish_reason": "stop", "tokens": i + 1, "stop_id": t}
        return {"ids": toks[:self.max_new_tokens], "finish_reason": "length",
                "tokens": min(len(toks), self.max_new_tokens)}

    @torch.no_grad()
    def _hf_generate(self, prompts: list, batch_index: int, sample: bool) -> list:
        lm = self.target.lm
        dev = self.target.lm_head_weight.device
        width = max(len(p) for p in prompts)
        kw: dict = {}
        if self.compile_backend is not None:
            from transformers import CompileConfig
            width = -(-width // self.pad_to_multiple) * self.pad_to_multiple
            cc = CompileConfig(backend=self.compile_backend, fullgraph=False, dynamic=self.dynamic,
                               mode="reduce-overhead" if self.compile_backend == "inductor"
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
            torch.manual_seed(self.seed * 1_000_003 + batch_index)
            kw.update(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=None)
        else:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        out = lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=self.max_new_tokens,
                          eos_token_id=self.stop or None, pad_token_id=self.pad_id, **kw)
        return [row[width:].tolist() for row in out]
