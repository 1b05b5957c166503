"""Speculative decoding against the target, and the acceptance length it achieves.

Each verify step the proposer drafts bs-1 tokens after the current token; one target
forward over [current, drafts] (the prefix lives in the KV cache, logits are computed
only for these bs positions) gives the target's distribution after each of them.
Greedy (temperature 0): drafts are accepted up to the first disagreement with the
target's argmax and the target's own token follows, so the output is exactly the
target's greedy decoding. Temperature > 0: the standard rejection rule (accept draft x
with probability min(1, p(x)/q(x)), else resample from max(0, p - q)), which leaves the
output distributed as the target's own samples. Acceptance length = accepted drafts + 1
per verify step (the last step of a prompt clamped to `max_new_tokens` / EOS).

Prompts run as a batch: every row shares one cache whose slots grow by bs per step;
rejected slots stay in the cache but are masked out of attention for good, and finished
rows leave the batch.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from dflash.decode.drafter import DrafterProposer
from dflash.decode.proposer import Proposer, sample
from dflash.decode.session import TargetSession
from dflash.decode.steps import emit


@dataclass
class EvalResult:
    accept_lengths: list  # per prompt: accepted tokens per verify step
    tokens: list  # per prompt: generated token ids
    block_size: int = 16

    @property
    def acceptance_length(self) -> float:
        """Mean over all verify steps of all prompts."""
        steps = [a for row in self.accept_lengths for a in row]
        return float(np.mean(steps)) if steps else 0.0

    @property
    def per_prompt(self) -> list:
        return [float(np.mean(r)) if r else 0.0 for r in self.accept_lengths]

    @property
    def histogram(self) -> list:
        """counts[k-1]: verify steps that accepted k tokens (k = 1..block_size)."""
        counts = np.zeros(self.block_size, dtype=np.int64)
        for row in self.accept_lengths:
            for a in row:
                counts[a - 1] += 1
        return counts.tolist()

    def as_dict(self) -> dict:
        return {"acceptance_length": self.acceptance_length, "per_prompt": self.per_prompt,
                # verify steps per prompt: with per_prompt, the pooled mean of any resample
                # of the prompts (the comparison's bootstrap of the eval's own noise)
                "per_prompt_steps": [len(r) for r in self.accept_lengths],
                "histogram": self.histogram,
                "verify_steps": int(sum(len(r) for r in self.accept_lengths)),
                "generated_tokens": int(sum(len(t) for t in self.tokens))}


@torch.no_grad()
def speculative_decode(target, proposer: Proposer, prompts, max_new_tokens: int = 64,
                       temperature: float = 0.0, eos_token_id=None, batch_size: int = 16,
                       seed: int = 0, progress: str | None = None) -> EvalResult:
    """Generate up to `max_new_tokens` per prompt; returns tokens and acceptance lengths.
    `progress`: a bar with this label counting prompts as they finish (None: silent)."""
    from tqdm.auto import tqdm

    prompts = [list(map(int, p)) for p in prompts]
    bar = tqdm(total=len(prompts), desc=progress, unit="prompt", disable=progress is None)
    bs = proposer.block_size
    eos = set() if eos_token_id is None else set(np.atleast_1d(eos_token_id).tolist())
    result = EvalResult([[] for _ in prompts], [[] for _ in prompts], bs)
    dev = target.lm_head_weight.device
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    for start in range(0, len(prompts), batch_size):
        chunk = list(range(start, min(len(prompts), start + batch_size)))
        cap = max(len(prompts[i]) for i in chunk) + max_new_tokens + bs + 1
        sess = TargetSession(target, [prompts[i] for i in chunk], cap,
                             capture=proposer.needs_context)
        p0 = sess.first_logits
        current = p0.argmax(-1) if temperature <= 0 else sample(
            torch.softmax(p0 / temperature, -1), gen)
        alive = list(chunk)  # prompt index of each row still in the batch
        while alive:
            t_step = time.perf_counter()
            drafts, q, limit = proposer.propose(sess, current, temperature, gen)
            block = torch.cat([current[:, None], drafts], dim=1)
            logits, ctx = sess.verify(block)
            n, nxt = _accept(logits, drafts, q, temperature, gen, limit)
            sess.commit(block, ctx, n + 1)
            sess.compact()
            n_host, block_host = n.tolist(), block.tolist()  # (waits for the device)
            proposer.observe(len(n_host) + sum(n_host), time.perf_counter() - t_step)
            keep_rows = _record(result, alive, n_host, block_host, max_new_tokens, eos)
            if len(keep_rows) < len(alive):
                bar.update(len(alive) - len(keep_rows))
                bar.set_postfix(accept=f"{result.acceptance_length:.2f}")
                idx = torch.tensor(keep_rows, dtype=torch.long, device=dev)
                sess.select(idx)
                nxt = nxt[idx]
                alive = [alive[r] for r in keep_rows]
            current = nxt
    bar.close()
    return result


def _record(result: EvalResult, alive: list, accepted: list, blocks: list,
            max_new_tokens: int, eos: set) -> list:
    """Each row's emitted tokens of this step into `result` (clamped to its room and cut
    after an EOS); the rows still decoding."""
    keep = []
    for r, i in enumerate(alive):
        room = max_new_tokens - len(result.tokens[i])
        emitted = blocks[r][:emit(accepted[r], room)]
        hit = [j for j, t in enumerate(emitted) if t in eos]
        emitted = emitted[:hit[0] + 1] if hit else emitted
        result.tokens[i] += emitted
        result.accept_lengths[i].append(len(emitted))
        if len(result.tokens[i]) < max_new_tokens and not hit:
            keep.append(r)
    return keep


def _accept(logits, drafts, q, temperature, gen, limit=None):
    """(accepted drafts n [B], the token that follows them [B]).

    logits[:, i] is the target's distribution after block token i (current, d1, ...).
    `limit` [B]: the drafts each row proposes (a confidence stop; None: all): the
    verify block still holds the rest, but they are never accepted, and a row whose
    every proposed draft was accepted takes the target's own next token there."""
    b, k = drafts.shape
    ar = torch.arange(b, device=drafts.device)
    proposed = (torch.ones_like(drafts, dtype=torch.long) if limit is None else
                (torch.arange(k, device=drafts.device)[None, :] < limit[:, None]).long())
    if temperature <= 0:
        choice = logits.argmax(-1)
        match = (choice[:, :k] == drafts).long() * proposed
        n = torch.cumprod(match, dim=1).sum(1)
        return n, choice[ar, n]
    p = torch.softmax(logits / temperature, -1)
    pd = p[:, :k].gather(2, drafts[..., None]).squeeze(-1)
    qd = torch.ones_like(pd) if q is None else q.gather(2, drafts[..., None]).squeeze(-1)
    u = torch.rand(pd.shape, generator=gen, device=pd.device)
    ok = (u <= (pd / qd.clamp_min(1e-20)).clamp(max=1.0)).long() * proposed
    n = torch.cumprod(ok, dim=1).sum(1)
    residual = p[ar, n].clone()  # bonus distribution where every proposed draft was accepted
    rejected = n < (k if limit is None else limit)
    if rejected.any():
        nr = n.clamp(max=k - 1)
        qn = (torch.nn.functional.one_hot(drafts[ar, nr], p.shape[-1]).float() if q is None
              else q[ar, nr])
        fix = (p[ar, nr] - qn).clamp_min(0)
        fix = fix / fix.sum(-1, keepdim=True).clamp_min(1e-20)
        residual = torch.where(rejected[:, None], fix, residual)
    return n, sample(residual, gen)


def evaluate(target, drafter, prompts, max_new_tokens: int = 64, zero_context: bool = False,
             confidence_stop: float = 0.0, **kw) -> EvalResult:
    was_training = drafter.training
    drafter.eval()
    try:
        proposer = DrafterProposer(drafter, target, zero_context, confidence_stop)
        return speculative_decode(target, proposer,
                                  prompts, max_new_tokens, **kw)
    finally:
        drafter.train(was_training)
