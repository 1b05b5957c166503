"""DSpark's objective (`loss=dspark`), as DeepSpec trains it.

Per drafting slot k (k = 0 .. n-1, the block's drafts in order) with the drafter's
logits z = LM head(h_k) + W2 W1[prev_k] (teacher forcing: prev is the data token):

    0.1 CE(z, y_k)                      the token the data has there
    0.9 sum_v |p_d - p_t|               L1 to the target's distribution p_t (its LM head
                                        on its final hidden state before y_k), no 1/2
    1.0 BCE(c_k, a_k)                   the confidence logit against the detached soft
                                        label a_k = clamp(1 - |p_d - p_t|_1 / 2, 0, 1)

each weighted by exp(-k/gamma) over the block's valid prefix (a slot after an
unsupervised one weighs 0), and every term divided by the weight summed over every rank
(`loss.norm=plan`; `batch`: this batch's), so a rank split changes nothing. With a draft
vocabulary both distributions run over its ids (the target's renormalised there) and a
token outside it carries no CE. The vocabulary-wide rows are computed a chunk of rows at
a time and recomputed in the backward (activation checkpointing): their memory is one
chunk's, whatever the vocabulary.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _rows(h, t, w1p, head, w2, targets, inside):
    """Per row: (CE, L1, argmax) of the drafter's biased logits against the target's."""
    z = (h.to(head.dtype) @ head.t()).float()
    if w2 is not None:
        z = z + (w1p @ w2.t()).float()
    logp = torch.log_softmax(z, -1)
    pt = torch.softmax((t.to(head.dtype) @ head.t()).float(), -1)
    l1 = (logp.exp() - pt).abs().sum(-1)
    ce = -logp.gather(-1, targets[:, None]).squeeze(-1) * inside
    return ce, l1, z.argmax(-1)


def rows_per_chunk(head, chunk_mb: float) -> int:
    """Rows a chunk holds: about `chunk_mb` of its ~4 [rows, V] float32 tensors."""
    return max(1, int(chunk_mb * 2 ** 20 // (4 * 4 * head.shape[0])))


def dspark_rows(h, t, w1p, head, w2, targets, inside, chunk_mb: float = 256):
    """`_rows` over row chunks of about `chunk_mb` of logits each, recomputed in the
    backward (h, t [R, H]; w1p [R, r] or None; head [V, H]; w2 [V, r] or None)."""
    per = rows_per_chunk(head, chunk_mb)
    outs = []
    for i in range(0, h.shape[0], per):
        sl = slice(i, i + per)
        args = (h[sl], t[sl], None if w1p is None else w1p[sl], head, w2, targets[sl],
                inside[sl])
        if torch.is_grad_enabled() and h.requires_grad:
            outs.append(checkpoint(_rows, *args, use_reentrant=False))
        else:
            outs.append(_rows(*args))
    return tuple(torch.cat(x) for x in zip(*outs))


def slot_weights(n: int, gamma: float, sup: torch.Tensor) -> torch.Tensor:
    """exp(-k/gamma), k = 0..n-1, over each block's valid prefix (sup [..., n])."""
    k = torch.arange(n, dtype=torch.float32, device=sup.device)
    live = torch.cumprod(sup.to(torch.int64), dim=-1)
    return torch.exp(-k / gamma) * live


def dspark_loss(ob, drafter, hidden, final, lm_head_weight, prev, targets, sup,
                anchor_valid, reduce_sum, output, step_weight=None):
    """hidden [B, A, n, H] the drafting slots' states; final [B, A, n, H] the target's
    final hidden state before each slot's token; prev [B, A, n] the data token before it;
    targets / sup [B, A, n]. `output` is loss._output (the logged figures); `step_weight`
    (weight, ranks): the normaliser when a step runs in row slices."""
    b, a, n, h = hidden.shape
    head = lm_head_weight if ob.vocab is None else ob.vocab.head(lm_head_weight)
    rows, inside = (targets, torch.ones_like(sup)) if ob.vocab is None else ob.vocab.targets(targets)
    mh, ch = drafter.markov_head, drafter.confidence_head
    w1p = None if mh is None else mh.markov_w1(prev).reshape(b * a * n, -1)
    ce, l1, argmax = dspark_rows(hidden.reshape(-1, h), final.reshape(-1, h), w1p, head,
                                 None if mh is None else mh.markov_w2.weight, rows.flatten(),
                                 inside.flatten().to(hidden.dtype), ob.chunk_mb)
    ce, l1 = ce.view_as(sup), l1.view_as(sup)
    w = slot_weights(n, ob.gamma, sup)
    ce_w, l1_w, conf_w = ob.dspark_weights
    total = l1_w * (w * l1).sum() + ce_w * (w * ce).sum()
    if ch is not None:
        conf = ch(hidden, w1p.view(b, a, n, -1))
        label = (1.0 - 0.5 * l1.detach()).clamp(0.0, 1.0)
        bce = F.binary_cross_entropy_with_logits(conf.float(), label, reduction="none")
        total = total + conf_w * (w * bce).sum()
    weight, ranks = w.sum(), 1
    if step_weight is not None:  # the whole step's, summed before (optim.micro_rows)
        weight, ranks = step_weight
    elif ob.norm == "plan" and reduce_sum is not None:
        weight, ranks = reduce_sum(weight)  # DDP then averages: x ranks makes it the sum
    loss = total * ranks / weight.clamp_min(1e-12)
    out = output(dataclasses.replace(ob, norm="batch"), loss, w, argmax, targets, sup,
                 anchor_valid, hidden)
    ce_weight = w * inside
    out.ce = (ce.detach() * ce_weight).sum() / ce_weight.sum().clamp_min(1e-12)
    return out
