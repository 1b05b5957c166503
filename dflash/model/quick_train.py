"""A thin training loop over the model pieces, for CPU-sized runs and examples.

`train_drafter` is the drafter step the runner will drive batch by batch: frozen target
context -> drafter -> fused weighted loss -> AdamW with warmup and clipping.
`fit_target_lm` and `greedy_continuations` make a tiny target worth drafting for (a
random-init model only repeats one token) and data that is consistent with it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .loss import drafter_loss


def warmup_cosine(step: int, total: int, warmup_ratio: float) -> float:
    warm = max(1, int(total * warmup_ratio))
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))


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
    acc1: list = field(default_factory=list)


def train_drafter(drafter, target, ids: torch.Tensor, loss_mask: torch.Tensor, steps: int,
                  batch: int = 16, lr: float = 3e-3, warmup_ratio: float = 0.04,
                  num_anchors: int = 32, gamma: float = 7.0, grad_clip: float = 1.0,
                  seed: int = 0, impl: str = "auto", progress: bool = False) -> DraftTrainLog:
    from tqdm.auto import tqdm

    drafter.train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    valid = torch.ones_like(loss_mask, dtype=torch.bool)
    log = DraftTrainLog()
    bar = tqdm(range(steps), desc="drafter", disable=not progress, mininterval=2.0)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr * warmup_cosine(step, steps, warmup_ratio)
        idx = torch.as_tensor(rng.integers(0, len(ids), batch))
        dev = target.lm_head_weight.device
        x, m, v = ids[idx].to(dev), loss_mask[idx].to(dev), valid[idx].to(dev)
        ctx = target.context(x, v.long())
        out = drafter_loss(drafter, ctx, target.embed_tokens, target.lm_head_weight, x, m, v,
                           num_anchors, gamma, gen, impl=impl)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), grad_clip)
        opt.step()
        log.loss.append(out.loss.item())
        log.accept_est.append(out.accept_len)
        log.acc1.append(float(out.acc[0]))
        bar.set_postfix(loss=f"{log.loss[-1]:.3f}", tau=f"{out.accept_len:.2f}")
    drafter.eval()
    return log
