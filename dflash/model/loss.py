"""Anchor sampling, block inputs and the position-weighted drafter loss.

For each sequence `num_anchors` anchor slots are filled with positions a where both
a and a+1 are supervised (at inference an anchor is always a token the target wrote);
slots beyond the candidates are marked invalid. Block position k (1..bs-1) predicts
token a+k with weight exp(-(k-1)/gamma) (a draft is accepted up to its first miss, so
early positions matter most); the loss is the weighted mean cross-entropy through the
fused LM-head kernel.

Normalisation (`loss.norm`). `batch`: the weighted mean over the batch, so a
block's weight is 1 / (the weight of its batch) and depends on which samples a batching
strategy put together (and, under DDP, on what the other ranks drew). `plan`: the
weighted sum divided by a constant known before step 1 (the plan's mean supervised
weight per batch), so every supervised (block position, token) counts the same whatever
batch or rank it lands in; DDP's mean over ranks then makes a step the sum over all
ranks' blocks divided by the expected weight of a whole step.

Every shape here is fixed by (batch size, padded length, num_anchors) and nothing reads
a value back to the host: the step runs without synchronising, and its metrics stay on
the device until the trainer gathers them every `logger.log_every` steps.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from dflash.kernels import fused_lm_head_ce, fused_lm_head_ce_rows, fused_lm_head_kl_rows
from dflash.errors import ConfigError
from dflash.model.dspark import first_slot
from dflash.model.dspark_loss import dspark_loss


@dataclass(frozen=True)
class Objective:
    """What the drafter is trained to do, and how its loss is computed."""
    num_anchors: int  # anchor slots per row (model.drafter.num_anchors; packed: per row)
    gamma: float = 7.0  # block position k weighs exp(-(k-1)/gamma)
    anchors_per_document: int = 0  # packed rows: each document's cap (0: none)
    chunk: int = 0  # LM-head rows per chunk (0: from chunk_mb and the vocabulary)
    chunk_mb: float = 256
    impl: str = "auto"  # fused CE kernel: auto | torch | triton
    norm: str = "batch"  # batch: weighted mean of the batch | plan: sum / batch_weight
    batch_weight: float = 1.0  # plan: the plan's mean supervised weight per batch
    kind: str = "ce"  # ce: fixed decay exp(-(k-1)/gamma) | dpace: D-PACE weights | kl
    dpace_alpha: float = 0.5  # D-PACE's a in (1 - a) q_i + a
    kl_temperature: float = 1.0  # kl: both distributions at this temperature (x T^2)
    # dspark: the weights of its CE, L1 and confidence BCE terms (DeepSpec's 0.1 / 0.9 / 1)
    dspark_weights: tuple = (0.1, 0.9, 1.0)
    # the softmax over these ids only (dflash.model.draft_vocab; kl: both distributions,
    # the target's renormalised over them); None: all
    vocab: object = None

    def __post_init__(self):
        if self.norm not in LOSS_NORMS:
            raise ConfigError(f"loss.norm must be one of {LOSS_NORMS}, got {self.norm!r}")
        if self.kind not in LOSS_KINDS:
            raise ConfigError(f"loss.kind must be one of {LOSS_KINDS}, got {self.kind!r}")
        if self.norm == "plan" and not self.batch_weight > 0:
            raise ValueError(f"loss.norm=plan needs a positive batch_weight, got {self.batch_weight}")

    def block_weight(self, block_size: int) -> float:
        """The loss weight of one fully supervised block."""
        return float(position_weights(block_size, self.gamma).sum())

    def expected_batch_weight(self, candidates, plan, block_size: int) -> float:
        """The mean supervised weight of a batch of `plan`: each sample contributes
        min(anchor slots, its anchor candidates) full blocks (a block cut by the end of
        its reply weighs less: a constant factor, the same for every batch)."""
        import numpy as np
        cap = self.anchors_per_document if plan.rows is not None and self.anchors_per_document \
            else self.num_anchors
        per_sample = np.minimum(np.asarray(candidates, dtype=np.int64), int(cap))
        blocks = int(per_sample[plan.indices].sum())
        return max(1.0, blocks * self.block_weight(block_size) / max(1, plan.num_batches))


LOSS_NORMS = ("batch", "plan")
LOSS_KINDS = ("ce", "dpace", "kl", "dspark")
# the objectives that read the target's own distribution (its final hidden state)
FINAL_HIDDEN_KINDS = ("kl", "dspark")


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar: what is minimised (see Objective.norm)
    acc: torch.Tensor  # [bs-1] top-1 accuracy of block positions 1..bs-1 (device)
    accept_len: torch.Tensor  # scalar: teacher-forced 1 + mean leading correct predictions
    rows: torch.Tensor  # scalar int64: supervised (block position, target) pairs
    blocks: torch.Tensor  # scalar int64: valid anchors
    ce: torch.Tensor | None = None  # scalar: weighted mean CE of the batch (what is logged)
    weight: torch.Tensor | None = None  # scalar: the loss weights' sum (ce's denominator)
    counts: torch.Tensor | None = None  # [bs-1] supervised rows a block position (acc's)


def dpace_weights(ce: torch.Tensor, sup: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE (arXiv 2605.18810): w_j = sum_{m >= j} prod_{i <= m} ((1 - a) q_i + a) with
    q_i = exp(-CE_i), over a block's positions [..., bs-1], detached. A draft is accepted
    up to its first miss, so the chain ends at the block's first unsupervised position."""
    live = torch.cumprod(sup.to(torch.int64), dim=-1).bool()
    r = ((1.0 - alpha) * torch.exp(-ce.detach().float()) + alpha) * live
    reach = torch.cumprod(r, dim=-1)  # prod_{i <= m}: 0 past the chain's end
    return reach.flip(-1).cumsum(-1).flip(-1) * live


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def anchor_candidates(loss_mask: torch.Tensor, valid: torch.Tensor,
                      position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """[B, S] bool: positions a with loss_mask[a] and loss_mask[a+1] (both real tokens,
    and in packed rows both in the same document)."""
    sup = loss_mask.bool() & valid.bool()
    cand = torch.zeros_like(sup)
    cand[:, :-1] = sup[:, :-1] & sup[:, 1:]
    if position_ids is not None:
        cand[:, :-1] &= position_ids[:, 1:] == position_ids[:, :-1] + 1
    return cand


def _per_document_cap(score: torch.Tensor, cand: torch.Tensor, position_ids: torch.Tensor,
                      cap: int) -> torch.Tensor:
    """Candidates that rank among the `cap` best scores of their own document: a packed
    document then gets at most the slots it would get as a row of its own."""
    doc = torch.cumsum((position_ids == 0).long(), dim=1)  # documents are contiguous
    # sort by (document, candidates first by falling score): keys stay in [doc, doc + 1)
    key = doc.double() + torch.where(cand, (1.0 - score.double()) * 0.5,
                                     torch.full_like(score, 0.75, dtype=torch.float64))
    key_sorted, order = torch.sort(key, dim=1)
    doc_sorted = key_sorted.floor().contiguous()
    first = torch.searchsorted(doc_sorted, doc_sorted, side="left")
    rank = torch.arange(key.shape[1], device=key.device)[None] - first
    keep = torch.zeros_like(cand)
    keep.scatter_(1, order, rank < cap)
    return cand & keep


def sample_anchors(loss_mask: torch.Tensor, valid: torch.Tensor, num_anchors: int,
                   generator: torch.Generator | None = None,
                   position_ids: torch.Tensor | None = None, per_document: int = 0):
    """anchors [B, num_anchors] (sorted: sorted anchors keep flex tiles dense) and
    anchor_valid [B, num_anchors]; invalid slots hold position 0. Slots are drawn
    uniformly among a row's candidates. In a packed row with `per_document` > 0 each
    document first keeps at most that many candidates (uniformly drawn), as if it were a
    row of its own with that many slots: training then sees the same blocks, document
    by document, as unpacked training (tested: equal losses step by step)."""
    b, s = loss_mask.shape
    cand = anchor_candidates(loss_mask, valid, position_ids)
    score = torch.rand(b, s, generator=generator, device=loss_mask.device)
    if position_ids is not None and per_document > 0:
        cand = _per_document_cap(score, cand, position_ids, int(per_document))
    score = torch.where(cand, score, torch.full_like(score, -1.0))
    k = min(int(num_anchors), s)
    top = score.topk(k, dim=1)
    ok = top.values >= 0
    anchors, order = torch.sort(torch.where(ok, top.indices, torch.full_like(top.indices, s)), dim=1)
    ok = torch.gather(ok, 1, order)
    anchors = torch.where(ok, anchors, torch.zeros_like(anchors))
    if k < num_anchors:  # a row shorter than the slot count: pad with invalid slots
        pad = num_anchors - k
        anchors = torch.cat([anchors, anchors.new_zeros(b, pad)], dim=1)
        ok = torch.cat([ok, ok.new_zeros(b, pad)], dim=1)
    return anchors, ok


def block_targets(ids, loss_mask, valid, anchors, anchor_valid, block_size, position_ids=None):
    """targets [B, A, bs-1] and supervision mask for block positions 1..bs-1 (in packed
    rows only positions still in the anchor's document are supervised)."""
    s = ids.shape[1]
    k = torch.arange(1, block_size, device=ids.device)
    pos = anchors[:, :, None] + k  # [B, A, bs-1]
    inside = pos < s
    pos_c = pos.clamp(max=s - 1)
    flat = lambda x: torch.gather(x, 1, pos_c.flatten(1)).view_as(pos)  # noqa: E731
    sup = inside & flat(loss_mask.bool()) & flat(valid.bool()) & anchor_valid[:, :, None]
    if position_ids is not None:
        start = torch.gather(position_ids, 1, anchors)[:, :, None]
        sup = sup & (flat(position_ids) == start + k)
    return flat(ids), sup


def block_embeddings(embed, ids, anchors, block_size, mask_token_id):
    b, a = anchors.shape
    anchor_tok = torch.gather(ids, 1, anchors)
    toks = torch.full((b, a, block_size), mask_token_id, dtype=ids.dtype, device=ids.device)
    toks[:, :, 0] = anchor_tok
    return embed(toks)


def drafter_loss(drafter, target_ctx, embed, lm_head_weight, ids, loss_mask, valid,
                 objective: Objective, generator=None, anchors=None,
                 position_ids=None, reduce_sum=None, step_weight=None) -> LossOutput:
    """`anchors` (a pair from `sample_anchors`) may be given to reuse a draw.
    `reduce_sum(x)` -> (x summed over data-parallel ranks, rank count): D-PACE and DSpark
    under norm=plan divide by the weight of the whole step, not of this rank's batch;
    `step_weight` (that pair, computed before: optim.micro_rows) gives it to DSpark."""
    bare = getattr(drafter, "module", drafter)  # through a DDP wrapper too
    bare = getattr(bare, "_orig_mod", bare)  # and torch.compile's
    spec, ob = bare.spec, objective
    bs, first = spec.block_size, first_slot(spec)
    n = bs - first  # the drafting slots: first .. bs-1
    final = None
    if ob.kind in FINAL_HIDDEN_KINDS:  # the target's final hidden state: the last H channels
        target_ctx, final = target_ctx[..., :-spec.hidden_size], target_ctx[..., -spec.hidden_size:]
    if anchors is None:
        anchors = sample_anchors(loss_mask, valid, ob.num_anchors, generator, position_ids,
                                 ob.anchors_per_document)
    anchors, anchor_valid = anchors
    emb = block_embeddings(embed, ids, anchors, bs, spec.mask_token_id)
    hidden = drafter(target_ctx, valid, anchors, anchor_valid, emb,
                     position_ids)[:, :, first:]  # [B, A, n, H]
    # slot first + k drafts the token at anchor + 1 + k
    targets, sup = block_targets(ids, loss_mask, valid, anchors, anchor_valid, n + 1, position_ids)
    # Unsupervised rows stay in with weight 0: a fixed row count, no boolean indexing
    # (which would read the count back to the host every step).
    targets = torch.where(sup, targets, torch.zeros_like(targets))
    if ob.kind == "dspark":
        return dspark_loss(ob, bare, hidden, final_before(final, anchors, n), lm_head_weight,
                           tokens_before(ids, anchors, n), targets, sup, anchor_valid,
                           reduce_sum, _output, step_weight)
    if ob.kind == "kl":
        return _kl_loss(ob, hidden, final, lm_head_weight, anchors, targets, sup, anchor_valid)
    head, rows, reach = lm_head_weight, targets, sup
    if ob.vocab is not None:  # the softmax over the draft vocabulary: misses outside it
        head = ob.vocab.head(lm_head_weight)
        rows, inside = ob.vocab.targets(targets)
        reach = sup & inside
    if ob.kind == "dpace":
        return _dpace_loss(ob, hidden, head, rows, targets, sup, reach, anchor_valid, reduce_sum)
    w = position_weights(n + 1, ob.gamma).to(hidden.device) * reach
    loss, _, argmax = fused_lm_head_ce(hidden.reshape(-1, hidden.shape[-1]), head,
                                       rows.flatten(), w.flatten(), chunk=ob.chunk, impl=ob.impl,
                                       chunk_mb=ob.chunk_mb)
    return _output(ob, loss, w, argmax, targets, sup, anchor_valid, hidden)


def _before_positions(anchors, n: int, length: int) -> torch.Tensor:
    """[B, A, n] the position one before each drafting slot's token (anchor + k, k =
    0..n-1), clamped at the row's end, where the slot is unsupervised anyway."""
    return (anchors[:, :, None] + torch.arange(n, device=anchors.device)).clamp(max=length - 1)


def tokens_before(ids, anchors, n: int) -> torch.Tensor:
    """[B, A, n] the token one before each drafting slot's (a Markov head's `prev`)."""
    pos = _before_positions(anchors, n, ids.shape[1])
    return torch.gather(ids, 1, pos.flatten(1)).view_as(pos)


def final_before(final, anchors, n: int) -> torch.Tensor:
    """[B, A, n, H] the target's final hidden state one before each drafting slot's token
    (what its LM head read to predict that token)."""
    b, a = anchors.shape
    pos = _before_positions(anchors, n, final.shape[1])
    h = final.shape[-1]
    return torch.gather(final, 1, pos.reshape(b, a * n, 1).expand(b, a * n, h)).view(b, a, n, h)


def _output(ob, loss, w, argmax, targets, sup, anchor_valid, hidden) -> LossOutput:
    if ob.vocab is not None:
        argmax = ob.vocab.full_ids(argmax)
    correct = (argmax.view_as(sup) == targets) & sup
    acc = correct.sum((0, 1)) / sup.sum((0, 1)).clamp_min(1)
    streak = torch.cumprod(correct.long(), dim=2).sum(2)  # leading correct drafts per block
    blocks = anchor_valid.sum()
    accept = 1.0 + (streak * anchor_valid).sum() / blocks.clamp_min(1)
    # a batch without a single supervised row still yields a differentiable zero
    ce = torch.where(sup.any(), loss, hidden.sum() * 0.0)
    if ob.norm == "plan":  # the weighted sum over a constant: every block weighs the same
        loss = ce * (w.sum() / ob.batch_weight)
    else:
        loss = ce
    return LossOutput(loss, acc.detach(), accept.detach(), sup.sum(), blocks, ce.detach(),
                      w.sum().detach(), sup.sum((0, 1)))


def _dpace_loss(ob, hidden, head, head_targets, targets, sup, reach, anchor_valid,
                reduce_sum) -> LossOutput:
    """The CE rows from the fused kernel (one pass over the vocabulary), weighted by
    D-PACE weights computed from those same rows. norm=plan: divided by the D-PACE
    weight of the whole step over every rank (so a rank split changes nothing);
    norm=batch: by this batch's weight. `head_targets` index `head`; `reach`: the
    supervised positions the head can score (a chain ends at the first it cannot)."""
    rows, argmax = fused_lm_head_ce_rows(hidden.reshape(-1, hidden.shape[-1]), head,
                                         head_targets.flatten(), chunk=ob.chunk, impl=ob.impl,
                                         chunk_mb=ob.chunk_mb)
    rows = rows.view_as(sup)
    w = dpace_weights(rows, reach, ob.dpace_alpha)
    total = w.sum()
    ranks = 1
    if ob.norm == "plan" and reduce_sum is not None:
        total, ranks = reduce_sum(total)  # DDP then averages: x ranks makes it the sum
    mean = (rows * w).sum() * ranks / total.clamp_min(1e-12)
    out = _output(dataclasses.replace(ob, norm="batch"), mean, w, argmax, targets, sup,
                  anchor_valid, hidden)
    out.ce = ((rows.detach() * w).sum() / w.sum().clamp_min(1e-12))
    return out


def combined(parts: list) -> LossOutput:
    """One batch's output from its row slices' (optim.micro_rows): the losses summed
    (each already over the plan's constant), the logged means re-weighted by their own
    denominators, so the figures equal those of the whole batch at once."""
    if len(parts) == 1:
        return parts[0]
    weight = sum(p.weight for p in parts)
    blocks = sum(p.blocks for p in parts)
    counts = sum(p.counts for p in parts)
    ce = sum(p.ce * p.weight for p in parts) / weight.clamp_min(1e-12)
    accept = 1.0 + sum((p.accept_len - 1.0) * p.blocks for p in parts) / blocks.clamp_min(1)
    acc = sum(p.acc * p.counts for p in parts) / counts.clamp_min(1)
    return LossOutput(sum(p.loss.detach() for p in parts), acc, accept,
                      sum(p.rows for p in parts), blocks, ce, weight, counts)


def _kl_loss(ob, hidden, final, lm_head_weight, anchors, targets, sup, anchor_valid) -> LossOutput:
    """KL(target || drafter) at every supervised block position, weighted and normalised
    as the CE (position decay, `norm`). Block position k drafts token anchor+k, whose
    distribution the target computed from its final hidden state at anchor+k-1. With a
    draft vocabulary both sides' softmax runs over its ids only (the target's
    distribution renormalised there: what it puts elsewhere is not drafted anyway)."""
    b, a, n, h = hidden.shape
    t_hidden = final_before(final, anchors, n)
    head = lm_head_weight if ob.vocab is None else ob.vocab.head(lm_head_weight)
    rows, argmax = fused_lm_head_kl_rows(hidden.reshape(-1, h), t_hidden.reshape(-1, h),
                                         head, ob.kl_temperature, ob.chunk, ob.chunk_mb)
    w = position_weights(n + 1, ob.gamma).to(hidden.device) * sup
    mean = (rows.view_as(sup) * w).sum() / w.sum().clamp_min(1e-12)
    return _output(ob, mean, w, argmax, targets, sup, anchor_valid, hidden)
