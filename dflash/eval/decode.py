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

from dataclasses import dataclass

import numpy as np
import torch

from dflash.errors import ConfigError
from dflash.model.dspark import first_slot, markov_chain, num_drafts
from dflash.model.loss import block_embeddings


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


# ---- the target side -----------------------------------------------------------------
class TargetSession:
    """The target over a batch of prompts with one KV cache; keeps, per row, the
    committed tokens and their drafter context (hidden states of the chosen layers)."""

    def __init__(self, target, prompts, capacity: int, capture: bool = True):
        from transformers import DynamicCache

        self.target = target
        dev = target.lm_head_weight.device
        self.device = dev
        b = len(prompts)
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        width = int(lens.max())
        ids = torch.zeros(b, width, dtype=torch.long, device=dev)
        for r, p in enumerate(prompts):
            ids[r, :len(p)] = torch.as_tensor(p, dtype=torch.long, device=dev)
        self.keep = torch.arange(width, device=dev)[None, :] < lens[:, None]  # cache slots in use
        self.lengths = lens.clone()  # committed tokens per row
        self.cache = DynamicCache()
        # a sliding-window target measures its window in cache slots: keep them in place
        tc = target.config
        sliding = any("sliding" in str(t) for t in (getattr(tc, "layer_types", None) or ())) or (
            getattr(tc, "sliding_window", None) is not None
            and getattr(tc, "use_sliding_window", True))
        self.compactable = not sliding
        # and a window counted in slots counts padding and rejected drafts too: its masks
        # are built here from each slot's position instead (sliding_masks)
        self.window = (int(tc.sliding_window) if sliding and getattr(tc, "_attn_implementation", "sdpa")
                       in ("sdpa", "eager") else None)  # (flash/flex read no 4D masks)
        self.slot_pos = torch.zeros(b, 0, dtype=torch.long, device=dev)  # cached slots' positions
        # the drafter's context; proposers of token ids (lookup, n-gram) need none
        self.capture = bool(capture)
        n_ctx = len(target.layer_ids) * target.hidden_size if capture else 0
        self.ctx = torch.zeros(b, capacity, n_ctx, dtype=target.lm_head_weight.dtype, device=dev)
        self.ids = torch.zeros(b, capacity, dtype=torch.long, device=dev)
        self.ids[:, :width] = ids
        pos = torch.arange(width, device=dev).expand(b, width)
        hidden, ctx = self._forward(ids, pos, self.keep.long())
        if capture:
            self.ctx[:, :width] = ctx.to(self.ctx.dtype)
        last = hidden[torch.arange(b, device=dev), lens - 1]
        self.first_logits = self._logits(last)  # [B, V]: distribution of the first new token

    def _forward(self, ids, pos, attention_mask):
        if self.window is not None:
            attention_mask = sliding_masks(self.target.config, self.slot_pos, pos,
                                           attention_mask.bool(), self.window,
                                           self.target.lm_head_weight.dtype)
            self.slot_pos = torch.cat([self.slot_pos, pos], dim=1)  # the cache's new slots

        def forward():
            return self.target.base(input_ids=ids, position_ids=pos,
                                    attention_mask=attention_mask, cache=self.cache,
                                    use_cache=True)
        if not self.capture:
            return forward().last_hidden_state, None
        out, ctx = self.target._run_capturing(forward, stop_early=False)
        return out.last_hidden_state, ctx

    def _logits(self, hidden):
        return self.target.lm.get_output_embeddings()(hidden).float()

    def verify(self, block: torch.Tensor):
        """block [B, bs] = [current, drafts]: logits [B, bs, V] and context [B, bs, n*H]."""
        bs = block.shape[1]
        pos = self.lengths[:, None] + torch.arange(bs, device=self.device)
        att = torch.cat([self.keep, torch.ones_like(block, dtype=torch.bool)], dim=1)
        hidden, ctx = self._forward(block, pos, att.long())
        return self._logits(hidden), ctx

    def commit(self, block, ctx, n_commit: torch.Tensor):
        """Keep the first n_commit[b] tokens of row b's verified block."""
        bs = block.shape[1]
        taken = torch.arange(bs, device=self.device)[None, :] < n_commit[:, None]
        self.keep = torch.cat([self.keep, taken], dim=1)
        rows, cols = taken.nonzero(as_tuple=True)
        dest = self.lengths[rows] + cols
        if self.capture:
            self.ctx[rows, dest] = ctx[rows, cols].to(self.ctx.dtype)
        self.ids[rows, dest] = block[rows, cols]
        self.lengths = self.lengths + n_commit

    def compact(self, waste: float = 0.5) -> None:
        """Drop the cache slots no row keeps (rejected drafts, padding) once they are more
        than `waste` of the cache: at low acceptance most of a block's slots are
        rejected, and a cache that keeps them grows by the block size a step, so every
        later step attends over and copies them. Kept slots move to the front of each
        row; the order of old slots does not matter (their positions are in the keys'
        rotary phases, and every new slot comes after all of them)."""
        n = self.keep.sum(1)
        width = int(n.max())
        if not self.compactable or width > (1 - waste) * self.keep.shape[1]:
            return
        order = torch.argsort((~self.keep).to(torch.int8), dim=1, stable=True)[:, :width]
        for layer in self.cache.layers:
            idx = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)
        self.keep = torch.arange(width, device=self.device)[None, :] < n[:, None]

    def select(self, rows: torch.Tensor):
        """Drop finished rows from the batch (and from the cache)."""
        for layer in self.cache.layers:
            layer.batch_select_indices(rows)
        self.keep, self.lengths = self.keep[rows], self.lengths[rows]
        self.ctx, self.ids, self.slot_pos = self.ctx[rows], self.ids[rows], self.slot_pos[rows]


def sliding_masks(config, slot_pos, pos, valid, window: int, dtype):
    """A sliding-window target's attention masks from positions, not cache slots: a query
    at position p sees the kept slots at positions p - window + 1 .. p (HF's window),
    full-attention layers every kept slot up to p. slot_pos [B, S] are the cached slots'
    positions, pos [B, Q] the new tokens', valid [B, S + Q] which slots count. Models
    with per-layer types take one mask a type; the others (Mistral) one 4D mask."""
    kv = torch.cat([slot_pos, pos], dim=1)[:, None, None, :]
    q = pos[:, None, :, None]
    full = valid[:, None, None, :] & (kv <= q)
    lowest = torch.finfo(dtype).min

    def additive(m):  # 0 / lowest, as eager and sdpa attention both add it
        return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, lowest)
    sliding = additive(full & (kv > q - window))
    if getattr(config, "layer_types", None):
        return {"full_attention": additive(full), "sliding_attention": sliding}
    return sliding


# ---- proposers -----------------------------------------------------------------------
class DrafterProposer:
    """The DFlash drafter: one forward drafts the whole block from the target context;
    a DSpark drafter's Markov head then chains the slots (each biased by the token the
    slot before chose, its argmax), and its confidence head may stop the block at the
    first slot below `confidence_stop` (llama.cpp's `--spec-draft-p-min`).
    `zero_context=True` multiplies the context by zero (the ablation that shows how much
    the drafter relies on the target)."""

    def __init__(self, drafter, target, zero_context: bool = False, confidence_stop: float = 0.0):
        self.drafter, self.target, self.zero = drafter, target, zero_context
        self.first = first_slot(drafter.spec)
        self.block_size = num_drafts(drafter.spec) + 1  # the verify block: anchor + drafts
        self.confidence_stop = float(confidence_stop)
        if self.confidence_stop > 0 and drafter.confidence_head is None:
            raise ConfigError(f"confidence_stop={confidence_stop}: this drafter has no confidence "
                              "head (model.drafter.confidence_head); set it to 0")

    @torch.no_grad()
    def logits(self, session: TargetSession, current: torch.Tensor) -> torch.Tensor:
        """[B, n, V] draft logits of the block anchored at each row's current token
        (a DSpark drafter's: Markov-biased along its greedy chain)."""
        return self._draft(session, current)[0]

    def _draft(self, session, current):
        width = int(session.lengths.max())
        ctx = session.ctx[:, :width]
        if self.zero:
            ctx = ctx * 0
        valid = torch.arange(width, device=ctx.device)[None, :] < session.lengths[:, None]
        anchors = session.lengths[:, None]
        spec = self.drafter.spec
        emb = block_embeddings(self.target.embed_tokens, current[:, None],
                               torch.zeros_like(anchors), spec.block_size, spec.mask_token_id)
        h = self.drafter(ctx, valid, anchors, torch.ones_like(anchors, dtype=torch.bool), emb)
        h = h[:, 0, self.first:]
        head = getattr(self.drafter, "draft_head", None)
        if head is not None:  # an exported draft vocabulary: its rows only
            dl = head.logits(h)
        else:
            dl = (h.to(self.target.lm_head_weight.dtype) @ self.target.lm_head_weight.t()).float()
        mh, prev = self.drafter.markov_head, None
        if mh is not None:
            dl, prev = markov_chain(dl, current, mh, dl.shape[-1])
        return dl, h, prev

    @torch.no_grad()
    def propose(self, session: TargetSession, current: torch.Tensor, temperature: float, gen):
        """(drafts [B, n], their distributions q [B, n, V] or None when greedy, drafts each
        row may keep [B] or None): the block anchored at each row's current token."""
        dl, h, prev = self._draft(session, current)
        mh, limit = self.drafter.markov_head, None
        if self.confidence_stop > 0:
            conf = torch.sigmoid(self.drafter.confidence_head(h, mh.markov_w1(prev)).float())
            limit = torch.cumprod((conf >= self.confidence_stop).long(), dim=1).sum(1)
        if temperature <= 0:
            return dl.argmax(-1), None, limit
        q = torch.softmax(dl / temperature, -1)
        return _sample(q.flatten(0, 1), gen).view(q.shape[:2]), q, limit


class NgramProposer:
    """A lookup table from the training data: the most frequent next token after the
    longest matching suffix (up to `order` tokens), chained to fill a block."""

    def __init__(self, sequences, masks=None, order: int = 3, block_size: int = 16):
        from collections import Counter, defaultdict

        self.order, self.block_size = int(order), int(block_size)
        counts = [defaultdict(Counter) for _ in range(self.order + 1)]
        uni = Counter()
        for i, seq in enumerate(sequences):
            seq = [int(t) for t in seq]
            sup = None if masks is None else np.asarray(masks[i], dtype=bool)
            for t in range(1, len(seq)):
                if sup is not None and not sup[t]:
                    continue
                uni[seq[t]] += 1
                for n in range(1, self.order + 1):
                    if t - n < 0:
                        break
                    counts[n][tuple(seq[t - n:t])][seq[t]] += 1
        self.tables = [None] + [{k: c.most_common(1)[0][0] for k, c in counts[n].items()}
                                for n in range(1, self.order + 1)]
        self.fallback = uni.most_common(1)[0][0] if uni else 0

    def next_token(self, history: list) -> int:
        for n in range(min(self.order, len(history)), 0, -1):
            tok = self.tables[n].get(tuple(history[-n:]))
            if tok is not None:
                return tok
        return self.fallback

    def draft(self, history: list) -> list:
        """The block's drafts after `history` (its last token is the anchor)."""
        hist, out = list(history), []
        for _ in range(self.block_size - 1):
            out.append(self.next_token(hist))
            hist.append(out[-1])
        return out

    def drafts(self, session: TargetSession, current: torch.Tensor) -> torch.Tensor:
        return _history_drafts(self.draft, session, current)


class PromptLookupProposer:
    """Drafts the tokens that followed the most recent earlier occurrence of the row's
    last `order`..1 tokens (prompt lookup decoding); the current token repeated when
    nothing matches."""

    def __init__(self, block_size: int = 4, order: int = 3):
        self.block_size, self.order = int(block_size), int(order)

    def drafts(self, session, current: torch.Tensor) -> torch.Tensor:
        return _history_drafts(self.draft, session, current)

    def draft(self, hist: list) -> list:
        """The block's drafts after `hist` (its last token is the anchor)."""
        want = self.block_size - 1
        for n in range(min(self.order, len(hist) - 1), 0, -1):
            tail = hist[-n:]
            for start in range(len(hist) - n - 1, -1, -1):
                if hist[start:start + n] == tail:
                    out = hist[start + n:start + n + want]
                    if out:
                        return out + [out[-1]] * (want - len(out))
        return [hist[-1]] * want


def _history_drafts(draft, session, current: torch.Tensor) -> torch.Tensor:
    """[B, bs-1] drafts of a proposer that drafts from each row's token history."""
    rows = [draft(session.ids[r, :int(session.lengths[r])].tolist() + [int(current[r])])
            for r in range(len(current))]
    return torch.tensor(rows, dtype=torch.long, device=current.device)


# ---- the decoding loop ---------------------------------------------------------------
def _sample(probs: torch.Tensor, generator) -> torch.Tensor:
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def speculative_decode(target, proposer, prompts, max_new_tokens: int = 64,
                       temperature: float = 0.0, eos_token_id=None, batch_size: int = 16,
                       seed: int = 0, progress: str | None = None) -> EvalResult:
    """Generate up to `max_new_tokens` per prompt; returns tokens and acceptance lengths.
    `progress`: a bar with this label counting prompts as they finish (None: silent)."""
    import time

    from tqdm.auto import tqdm

    prompts = [list(map(int, p)) for p in prompts]
    bar = tqdm(total=len(prompts), desc=progress, unit="prompt", disable=progress is None)
    bs = getattr(proposer, "block_size", 16)
    eos = set() if eos_token_id is None else set(np.atleast_1d(eos_token_id).tolist())
    result = EvalResult([[] for _ in prompts], [[] for _ in prompts], bs)
    dev = target.lm_head_weight.device
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    for start in range(0, len(prompts), batch_size):
        chunk = list(range(start, min(len(prompts), start + batch_size)))
        cap = max(len(prompts[i]) for i in chunk) + max_new_tokens + bs + 1
        sess = TargetSession(target, [prompts[i] for i in chunk], cap,
                             capture=not hasattr(proposer, "drafts"))
        p0 = sess.first_logits
        current = p0.argmax(-1) if temperature <= 0 else _sample(
            torch.softmax(p0 / temperature, -1), gen)
        alive = list(chunk)  # prompt index of each row still in the batch
        while alive:
            t_step = time.perf_counter()
            if hasattr(proposer, "drafts"):  # proposes token ids (n-gram, prompt lookup)
                drafts, q, limit = proposer.drafts(sess, current), None, None
            else:
                drafts, q, limit = proposer.propose(sess, current, temperature, gen)
            block = torch.cat([current[:, None], drafts], dim=1)
            logits, ctx = sess.verify(block)
            n, nxt = _accept(logits, drafts, q, temperature, gen, limit)
            sess.commit(block, ctx, n + 1)
            sess.compact()
            keep_rows = []
            n_host, block_host = n.tolist(), block.tolist()  # (waits for the device)
            if hasattr(proposer, "observe"):  # a proposer that measures what drafting buys
                proposer.observe(len(n_host) + sum(n_host), time.perf_counter() - t_step)
            for r, i in enumerate(alive):
                emitted = block_host[r][:n_host[r] + 1]
                room = max_new_tokens - len(result.tokens[i])
                hit = [j for j, t in enumerate(emitted[:room]) if t in eos]
                emitted = emitted[:min(room, hit[0] + 1 if hit else room)]
                result.tokens[i] += emitted
                result.accept_lengths[i].append(len(emitted))
                if len(result.tokens[i]) < max_new_tokens and not hit:
                    keep_rows.append(r)
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
    return n, _sample(residual, gen)


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
