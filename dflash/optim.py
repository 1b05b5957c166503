"""AdamW with linear warmup and cosine decay (the DFlash recipe: lr 6e-4, warmup 4%)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash.errors import require
from dflash.options import options
from dflash.schedule import warmup_cosine
from dflash.step import NONFINITE


def build_optimizer(params, cfg, total_steps: int, output_norm=None, norm_lr_scale: float = 1.0):
    """(AdamW, LambdaLR) from `optim.*`; fused/foreach kernels where the device has them.
    `output_norm` (the drafter's final norm weight) learns at lr x `norm_lr_scale`
    (model.drafter.norm_lr_scale), in a group of its own only when that is not 1."""
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("the drafter has no trainable parameters")
    on_cuda = params[0].device.type == "cuda"
    scale = float(norm_lr_scale)
    if output_norm is not None and scale != 1.0:
        rest = [p for p in params if p is not output_norm]
        params = [{"params": rest}, {"params": [output_norm], "lr": float(cfg.lr) * scale}]
    opt = torch.optim.AdamW(params, lr=float(cfg.lr), weight_decay=float(cfg.weight_decay),
                            betas=(float(cfg.beta1), float(cfg.beta2)),
                            **({"fused": True} if on_cuda else {"foreach": True}))
    ratio, floor = float(cfg.warmup_ratio), float(cfg.min_lr_ratio)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: warmup_cosine(s, total_steps, ratio, floor))
    return opt, sched


def check_optim(cfg) -> None:
    """`optim.*` values that cannot work, refused at start (torch would raise a traceback
    at the optimizer's build, after the target loaded, or train on silently)."""
    require(float(cfg.lr) > 0, "optim.lr", cfg.lr, "> 0")
    require(0 <= float(cfg.warmup_ratio) <= 1, "optim.warmup_ratio", cfg.warmup_ratio, "in [0, 1]")
    require(float(cfg.weight_decay) >= 0, "optim.weight_decay", cfg.weight_decay, ">= 0")
    require(float(cfg.grad_clip) >= 0, "optim.grad_clip", cfg.grad_clip, ">= 0 (0: off)")
    for key in ("beta1", "beta2"):
        require(0 <= float(cfg[key]) < 1, f"optim.{key}", cfg[key], "in [0, 1)")
    require(0 <= float(cfg.min_lr_ratio) <= 1, "optim.min_lr_ratio", cfg.min_lr_ratio, "in [0, 1]")
    require(int(cfg.micro_rows) >= 0, "optim.micro_rows", cfg.micro_rows, ">= 0 (0: whole batches)")
    require(int(cfg.max_skips) >= 0, "optim.max_skips", cfg.max_skips, ">= 0")


# ---- its config section (registered with Hydra by dflash.config) ----

NonFinite = options("NonFinite", NONFINITE)


@dataclass
class OptimConfig:
    lr: float = 6e-4  # AdamW peak learning rate
    warmup_ratio: float = 0.04  # linear warmup, share of the steps
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max grad norm (0: off)
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    min_lr_ratio: float = 0.0  # cosine decay floor, share of lr
    max_steps: int = -1  # > 0: stop after this many steps (the schedule spans them)
    # > 0: stop once this many real tokens were trained on (the schedule spans the steps
    # that takes): strategies compared on equal data
    max_tokens: int = -1
    # a NaN/inf loss or gradient: stop (found at the next metric sync, no extra host
    # sync; names the step and samples) or skip the update (one host check per step)
    nonfinite: NonFinite = NonFinite.stop
    max_skips: int = 10  # skip: stop once more steps than this were skipped
    # > 0: the drafter's forward and backward take this many rows of a batch at a time
    # (gradients accumulate, one update: the same step, with activation memory for
    # this many rows; `python -m dflash.preflight` says what fits). loss.norm=plan with
    # ce, kl or dspark. 0: whole batches
    micro_rows: int = 0
