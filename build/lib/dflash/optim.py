"""AdamW with linear warmup and cosine decay (the DFlash recipe: lr 6e-4, warmup 4%)."""
from __future__ import annotations

import math

import torch


def warmup_cosine(step: int, total: int, warmup_ratio: float, min_ratio: float = 0.0) -> float:
    """LR multiplier at `step` (0-based) of `total`: linear warmup, then cosine to min_ratio."""
    warm = max(1, int(math.ceil(total * warmup_ratio)))
    if step < warm:
        return (step + 1) / warm
    t = min(1.0, (step - warm) / max(1, total - warm))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))


def build_optimizer(params, cfg, total_steps: int):
    """(AdamW, LambdaLR) from `optim.*`; fused/foreach kernels where the device has them."""
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("the drafter has no trainable parameters")
    on_cuda = params[0].device.type == "cuda"
    opt = torch.optim.AdamW(params, lr=float(cfg.lr), weight_decay=float(cfg.weight_decay),
                            betas=(float(cfg.beta1), float(cfg.beta2)),
                            **({"fused": True} if on_cuda else {"foreach": True}))
    ratio, floor = float(cfg.warmup_ratio), float(cfg.min_lr_ratio)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: warmup_cosine(s, total_steps, ratio, floor))
    return opt, sched
