"""Small helpers around the runner's step, for tests and examples on CPU.

`train_drafter` drives `dflash.step.TrainStep` (the runner's own step) over random
batches of fixed-length rows; `fit_target_lm` and `greedy_continuations` make a tiny
target worth drafting for and data consistent with it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from dflash.optim import warmup_cosine
from dflash.model.loss import Objective
from dflash.step import DeviceBatch, StepPolicy, TrainStep


def fit_target_lm(target, sequences: torch.Tensor, steps: int, batch: int = 32,
                  lr: float = 3e-3, seed: int = 0) -> list[float]:
    """Next-token training of the target itself (then frozen again)."""
    lm = target.lm
    lm.train().requires_grad_(True)
    opt = torch.optim.AdamW(lm.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * warmup_cosine(step, steps, 0.05)
        idx = torch.randint(0, len(sequences), (batch,), generator=gen)
        x = sequences[idx].to(target.lm_head_weight.device)
        loss = lm(input_ids=x, labels=x, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    lm.eval().requires_grad_(False)
    return losses


@torch.no_grad()
def greedy_continuations(target, prompts: torch.Tensor, new_tokens: int, batch: int = 64):
    """[N, P + new_tokens] sequences: each prompt followed by the target's greedy output."""
    outs = []
    for s in range(0, len(prompts), batch):
        p = prompts[s:s + batch].to(target.lm_head_weight.device)
        outs.append(target.lm.generate(input_ids=p, attention_mask=torch.ones_like(p),
                                       max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                       do_sample=False, pad_token_id=0))
    return torch.cat(outs).cpu()


@dataclass
class DraftTrainLog:
    loss: list = field(default_factory=list)
    accept_est: list = field(default_factory=list)


def train_drafter(drafter, target, ids: torch.Tensor, loss_mask: torch.Tensor, steps: int,
                  batch: int = 16, lr: float = 3e-3, warmup_ratio: float = 0.04,
                  num_anchors: int = 32, gamma: float = 7.0, grad_clip: float = 1.0,
                  seed: int = 0, impl: str = "auto") -> DraftTrainLog:
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, steps, warmup_ratio))
    dev = next(drafter.parameters()).device
    step = TrainStep(target, drafter, opt, sched, Objective(num_anchors, gamma, impl=impl),
                     StepPolicy(grad_clip=grad_clip), generator=torch.Generator(device=dev).manual_seed(seed))
    rng = np.random.default_rng(seed)
    log = DraftTrainLog()
    for _ in range(steps):
        idx = torch.as_tensor(rng.integers(0, len(ids), batch))
        m = loss_mask[idx].to(dev)
        b = DeviceBatch(None, ids[idx].to(dev), m, torch.ones_like(m, dtype=torch.bool))
        out = step(b)
        log.loss.append(float(out["loss"]))
        log.accept_est.append(float(out["accept_est"]))
    drafter.eval()
    return log
