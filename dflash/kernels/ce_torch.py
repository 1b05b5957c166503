"""Torch reference for one chunk: the same contract as the Triton kernel."""
from __future__ import annotations

import torch


def ce_chunk_torch(logits: torch.Tensor, target: torch.Tensor, scale: torch.Tensor):
    """Per-row loss and argmax; `logits` ([n, V]) is overwritten with dloss/dlogits."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    loss = lse - x.gather(1, target[:, None]).squeeze(1)
    argmax = x.argmax(dim=-1)
    grad = torch.exp(x - lse[:, None])
    grad.scatter_add_(1, target[:, None], -torch.ones_like(lse)[:, None])
    grad.mul_(scale.float()[:, None])
    logits.copy_(grad)
    return loss, argmax
