"""LM head + weighted cross-entropy without the [tokens x vocab] logits.

Rows are processed in chunks: logits_chunk = h_chunk @ W^T (a plain matmul, so it runs
on tensor cores), then a per-row kernel turns the chunk into loss, argmax and, in place,
d(CE_i)/d(logits), and dh_chunk = dlogits @ W (scaled by each row's weight in the
backward, so weights may depend on the CE itself). The gradient is computed during the
forward and kept ([tokens x hidden], small), so peak memory is O(chunk x vocab).

    loss = sum_i w_i * CE(h_i W^T, y_i) / sum_i w_i

W is the target's frozen LM head: it gets no gradient.
"""
from __future__ import annotations

import torch

from dflash.kernels.ce_torch import ce_chunk_torch
from dflash.errors import ConfigError


LOSS_IMPLS = ("auto", "torch", "triton")


def _chunk_fn(impl: str):
    if impl == "torch":
        return ce_chunk_torch
    if impl == "triton":
        from dflash.kernels.ce_triton import ce_chunk_triton
        return ce_chunk_triton
    raise ConfigError(f"model.loss_impl must be 'auto', 'torch' or 'triton', got {impl!r}")


def auto_chunk(vocab: int, weight_dtype: torch.dtype, impl: str, memory_mb: float) -> int:
    """Rows per chunk so that one chunk's logits (and, for the torch path with a
    16-bit head, their fp32 copy) take about `memory_mb`: peak memory then follows the
    target, not the vocabulary (at 151,936 x fp32 and 256 MB: 432 rows)."""
    per_row = vocab * torch.empty(0, dtype=weight_dtype).element_size()
    if impl == "torch" and weight_dtype != torch.float32:
        per_row += vocab * 4
    rows = int(memory_mb * 2**20) // max(1, per_row)
    return max(16, rows // 16 * 16)


def resolve_impl(impl: str, device: torch.device) -> str:
    if impl == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return impl


class RowLosses(torch.autograd.Function):
    """Per-row losses as a differentiable output, through a frozen LM head, chunk by
    chunk. `chunk_fn(s, e, need_grad)` returns rows [s, e)'s losses, argmax and (when
    asked) their gradient w.r.t. hidden, unscaled: it does not depend on a row's loss
    weight, which the backward applies, so a weight may be computed from the loss itself
    (D-PACE) without a second pass over the vocabulary. Shared by the CE and the KL."""

    @staticmethod
    def forward(ctx, hidden, chunk_fn, chunk):
        n = hidden.shape[0]
        losses = torch.empty(n, dtype=torch.float32, device=hidden.device)
        argmax = torch.empty(n, dtype=torch.int64, device=hidden.device)
        grad_h = torch.empty_like(hidden) if hidden.requires_grad else None
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            losses[s:e], argmax[s:e], g = chunk_fn(s, e, grad_h is not None)
            if grad_h is not None:
                grad_h[s:e] = g
        ctx.save_for_backward(grad_h if grad_h is not None else hidden.new_empty(0))
        ctx.mark_non_differentiable(argmax)
        return losses, argmax

    @staticmethod
    def backward(ctx, grad_losses, _grad_argmax):
        (grad_h,) = ctx.saved_tensors
        return grad_h * grad_losses[:, None].to(grad_h.dtype), None, None


def fused_lm_head_ce_rows(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                          chunk: int = 0, impl: str = "auto", chunk_mb: float = 256):
    """(per-row CE [n], differentiable; per-row argmax [n]) without the [n x V] logits.

    hidden [n, H], weight [V, H] (frozen), target [n] int64. `chunk` rows per chunk; 0
    (default): from the vocabulary and `chunk_mb` (auto_chunk).
    """
    if hidden.shape[0] != target.shape[0]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and target {tuple(target.shape)} "
                         "must agree on the row count")
    impl = resolve_impl(impl, hidden.device)
    if int(chunk) <= 0:
        chunk = auto_chunk(weight.shape[0], weight.dtype, impl, chunk_mb)
    fn, weight = _chunk_fn(impl), weight.detach()
    ones = torch.ones(hidden.shape[0], dtype=torch.float32, device=hidden.device)

    def ce_chunk(s, e, need_grad):
        # the LM head's dtype decides the matmul (bf16 target, fp32 drafter: bf16)
        logits = (hidden[s:e].detach().to(weight.dtype) @ weight.t()).contiguous()
        loss, arg = fn(logits, target[s:e], ones[s:e])  # logits now hold dCE/dlogits
        grad = (logits.to(weight.dtype) @ weight).to(hidden.dtype) if need_grad else None
        return loss, arg, grad

    return RowLosses.apply(hidden, ce_chunk, int(chunk))


def fused_lm_head_ce(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                     weights: torch.Tensor, chunk: int = 0, impl: str = "auto",
                     chunk_mb: float = 256):
    """(weighted mean loss, per-row CE [n], per-row argmax [n]); weights [n] >= 0 (a
    row of weight 0 may hold any valid target id)."""
    if target.shape != weights.shape:
        raise ValueError(f"target {tuple(target.shape)} and weights {tuple(weights.shape)} "
                         "must agree on the row count")
    losses, argmax = fused_lm_head_ce_rows(hidden, weight, target, chunk, impl, chunk_mb)
    scale = weights.float() / weights.float().sum().clamp_min(1e-12)
    return (losses * scale).sum(), losses.detach(), argmax


def naive_lm_head_ce(hidden, weight, target, weights):
    """Materialises every logit: the baseline the fused path is measured against."""
    logits = (hidden @ weight.t()).float()
    losses = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    return (losses * weights).sum() / weights.sum().clamp_min(1e-12), losses, logits.argmax(-1)
