"""Torch reference for one chunk: the same contract as the Triton kernel."""
from __future__ import annotations

import torch


def ce_chunk_torch(logits: torch.Tensor, target: torch.Tensor, scale: torch.Tensor):
    """Per-row loss and argmax; `logits` ([n, V]) is overwritten with dloss/dlogits.

    Everything after the reads of the target logit and the argmax happens in place
    (shift, exp, normalise), so an fp32 chunk needs no [n, V] temporary at all and a
    bf16 one only its fp32 copy: the chunk's logits are the whole peak."""
    x = logits if logits.dtype == torch.float32 else logits.float()
    picked = x.gather(1, target[:, None]).squeeze(1)
    argmax = x.argmax(dim=-1)
    top = x.amax(dim=-1)
    x.sub_(top[:, None]).exp_()
    total = x.sum(dim=-1)
    loss = top + total.log() - picked
    x.div_(total[:, None])  # softmax
    x.scatter_add_(1, target[:, None], -torch.ones_like(total)[:, None])
    x.mul_(scale.float()[:, None])
    if x is not logits:
        logits.copy_(x)
    return loss, argmax
