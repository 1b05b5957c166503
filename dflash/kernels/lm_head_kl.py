"""LM head + KL(target || drafter) per row, without keeping [rows x vocab] logits.

Distillation scores each block position against the target's own next-token
distribution: both sides' logits come from the same frozen LM head W (the drafter's
hidden h_d and the target's final hidden h_t), chunk by chunk, as the fused CE does:

    KL_i = T^2 * sum_v p_t(v) (log p_t(v) - log p_d(v)),  p = softmax(z / T)
    dKL_i / dz_d = T * (p_d - p_t),  dh_d = dz_d @ W

The gradient is computed in the forward, per row and unscaled, and weighted in the
backward (like the CE), so only O(chunk x vocab) logits ever exist. T^2 keeps the
gradient's scale independent of the temperature (Hinton et al.).
"""
from __future__ import annotations

import torch

from dflash.kernels.lm_head_loss import RowLosses, auto_chunk


def fused_lm_head_kl_rows(hidden: torch.Tensor, target_hidden: torch.Tensor, weight: torch.Tensor,
                          temperature: float = 1.0, chunk: int = 0, chunk_mb: float = 256):
    """(per-row KL(target || drafter) [n], differentiable in `hidden`; per-row argmax of
    the drafter's logits [n]). hidden, target_hidden [n, H]; weight [V, H] (frozen)."""
    if hidden.shape != target_hidden.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and target_hidden "
                         f"{tuple(target_hidden.shape)} must have the same shape")
    if int(chunk) <= 0:  # ~5 fp32 [chunk, V] temporaries live at once
        chunk = auto_chunk(weight.shape[0], torch.float32, "triton", chunk_mb / 5)
    t, weight, target_hidden = float(temperature), weight.detach(), target_hidden.detach()

    def kl_chunk(s, e, need_grad):
        zd = (hidden[s:e].detach().to(weight.dtype) @ weight.t()).float()
        arg = zd.argmax(-1)
        log_pd = torch.log_softmax(zd.div_(t), dim=-1)
        log_pt = torch.log_softmax((target_hidden[s:e].to(weight.dtype) @ weight.t()).float()
                                   .div_(t), dim=-1)
        pt = log_pt.exp()
        kl = (pt * (log_pt - log_pd)).sum(-1) * (t * t)
        if not need_grad:
            return kl, arg, None
        dz = log_pd.exp_().sub_(pt).mul_(t)  # T * (p_d - p_t), in place
        return kl, arg, (dz.to(weight.dtype) @ weight).to(hidden.dtype)

    return RowLosses.apply(hidden, kl_chunk, int(chunk))
