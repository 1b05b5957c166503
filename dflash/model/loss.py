"""Anchor sampling, block inputs and the position-weighted drafter loss.

For each sequence up to `num_anchors` anchors a are drawn among positions whose next
token is supervised. Block position k (1..bs-1) predicts token a+k with weight
exp(-(k-1)/gamma) (early positions matter most: a draft is accepted up to its first
miss). The loss is the weighted mean cross-entropy, through the fused LM-head kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import fused_lm_head_ce


@dataclass
class LossOutput:
    loss: torch.Tensor
    acc: torch.Tensor  # [bs-1] top-1 accuracy of block positions 1..bs-1
    accept_len: float  # teacher-forced estimate: 1 + mean leading correct predictions
    rows: int  # supervised (block position, target) pairs


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def sample_anchors(loss_mask: torch.Tensor, valid: torch.Tensor, num_anchors: int,
                   generator: torch.Generator | None = None):
    """anchors [B, A] and anchor_valid [B, A]; candidates are a >= 1 with loss_mask[a+1]."""
    b, s = loss_mask.shape
    cand = torch.zeros_like(loss_mask, dtype=torch.bool)
    cand[:, 1:-1] = loss_mask[:, 2:] & valid[:, 2:]
    counts = cand.sum(1)
    a = int(min(num_anchors, counts.max().item())) if b else 0
    if a == 0:
        z = torch.zeros(b, 1, dtype=torch.long, device=loss_mask.device)
        return z, torch.zeros(b, 1, dtype=torch.bool, device=loss_mask.device)
    score = torch.rand(b, s, generator=generator, device="cpu").to(loss_mask.device)
    score = torch.where(cand, score, torch.full_like(score, -1.0))
    top = score.topk(a, dim=1)
    anchors, ok = top.indices, top.values >= 0
    anchors, order = torch.sort(torch.where(ok, anchors, torch.full_like(anchors, s)), dim=1)
    ok = torch.gather(ok, 1, order)
    return torch.where(ok, anchors, torch.zeros_like(anchors)), ok


def block_targets(ids, loss_mask, valid, anchors, anchor_valid, block_size):
    """targets [B, A, bs-1] and supervision mask for block positions 1..bs-1."""
    s = ids.shape[1]
    k = torch.arange(1, block_size, device=ids.device)
    pos = anchors[:, :, None] + k  # [B, A, bs-1]
    inside = pos < s
    pos_c = pos.clamp(max=s - 1)
    flat = lambda x: torch.gather(x, 1, pos_c.flatten(1)).view_as(pos)  # noqa: E731
    sup = inside & flat(loss_mask) & flat(valid) & anchor_valid[:, :, None]
    return flat(ids), sup


def block_embeddings(embed, ids, anchors, block_size, mask_token_id):
    b, a = anchors.shape
    anchor_tok = torch.gather(ids, 1, anchors)
    toks = torch.full((b, a, block_size), mask_token_id, dtype=ids.dtype, device=ids.device)
    toks[:, :, 0] = anchor_tok
    return embed(toks)


def drafter_loss(drafter, target_ctx, embed, lm_head_weight, ids, loss_mask, valid,
                 num_anchors: int, gamma: float, generator=None, chunk: int = 1024,
                 impl: str = "auto") -> LossOutput:
    spec = drafter.spec
    bs = spec.block_size
    anchors, anchor_valid = sample_anchors(loss_mask, valid, num_anchors, generator)
    emb = block_embeddings(embed, ids, anchors, bs, spec.mask_token_id)
    hidden = drafter(target_ctx, valid, anchors, anchor_valid, emb)[:, :, 1:]  # [B, A, bs-1, H]
    targets, sup = block_targets(ids, loss_mask, valid, anchors, anchor_valid, bs)
    w = position_weights(bs, gamma).to(hidden.device).expand_as(sup)
    rows = sup.flatten()
    h = hidden.reshape(-1, hidden.shape[-1])[rows]
    if h.shape[0] == 0:
        zero = hidden.sum() * 0.0
        return LossOutput(zero, torch.zeros(bs - 1), 1.0, 0)
    loss, _, argmax = fused_lm_head_ce(h, lm_head_weight, targets.flatten()[rows],
                                       w.flatten()[rows], chunk=chunk, impl=impl)
    correct = torch.zeros(sup.numel(), dtype=torch.bool, device=sup.device)
    correct[rows] = argmax == targets.flatten()[rows]
    correct = correct.view_as(sup)
    per_k = sup.sum((0, 1)).clamp_min(1)
    acc = (correct.sum((0, 1)) / per_k).detach().float().cpu()
    blocks = anchor_valid
    streak = torch.cumprod(correct.long(), dim=2).sum(2)[blocks]
    accept = 1.0 + float(streak.float().mean()) if streak.numel() else 1.0
    return LossOutput(loss, acc, accept, int(rows.sum()))

