"""Tiny models and inputs, built locally from a config with fixed seeds."""
from __future__ import annotations

import torch
from omegaconf import OmegaConf

from dflash.config import DrafterConfig, TargetConfig
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.target import Target


def tiny_target(**overrides) -> Target:
    return Target.from_config(OmegaConf.structured(TargetConfig(**overrides)))


def tiny_drafter(target, layers: int = 1, seed: int = 0) -> DFlashDrafter:
    torch.manual_seed(seed)
    return DFlashDrafter(DrafterSpec.from_target(
        target, OmegaConf.structured(DrafterConfig(num_layers=layers))))


def random_prompts(n: int = 5) -> list:
    g = torch.Generator().manual_seed(4)
    return [torch.randint(3, 500, (int(k),), generator=g).tolist() for k in
            torch.randint(3, 20, (n,), generator=g)]


def packed_row(docs, row_len: int):
    """One packed row of the given documents (lists of ids) and its position ids."""
    ids = torch.zeros(1, row_len, dtype=torch.long)
    pos = torch.arange(row_len)[None].clone()
    valid = torch.zeros(1, row_len, dtype=torch.bool)
    at, spans = 0, []
    for d in docs:
        ids[0, at:at + len(d)] = torch.tensor(d)
        pos[0, at:at + len(d)] = torch.arange(len(d))
        valid[0, at:at + len(d)] = True
        spans.append((at, at + len(d)))
        at += len(d)
    pos[0, at:] = torch.arange(row_len - at)
    return ids, pos, valid, spans


def loss_batch(target, anchors: int = 6):
    """Three padded rows (60, 44, 52 tokens, the first 20 unsupervised), a fixed anchor
    draw and the target's context: one drafter-loss batch, the same in every test."""
    from dflash.model.loss import sample_anchors
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([60, 44, 52])
    ids = torch.randint(3, 500, (3, 60), generator=g)
    valid = torch.arange(60)[None] < lengths[:, None]
    mask = valid & (torch.arange(60)[None] >= 20)
    drawn = sample_anchors(mask, valid, anchors, torch.Generator().manual_seed(4))
    return ids, mask, valid, drawn, target.context(ids, valid.long())
