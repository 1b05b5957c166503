"""The target's side of speculative decoding: a batch of prompts over one KV cache.

Every row shares one cache whose slots grow by the verify block's size per step;
rejected slots stay in the cache but are masked out of attention for good (and are
compacted away once they are most of it), and finished rows leave the batch.
"""
from __future__ import annotations

import torch


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
