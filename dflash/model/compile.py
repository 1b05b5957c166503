"""The torch.compile backend a run asks for, checked before any work is done."""
from __future__ import annotations

import torch

from dflash.errors import ConfigError
from dflash.options import choice


def checked_backend(name: str) -> str:
    """`model.compile_backend`, refused naming the key when torch has no such backend
    (a typo would otherwise surface as dynamo's error at the first compiled step)."""
    known = torch._dynamo.list_backends(exclude_tags=())
    if name not in known:
        raise ConfigError(f"model.compile_backend={name} is not a torch.compile backend "
                          f"(one of {', '.join(known)})")
    return name


def compile_drafter(drafter, model_cfg, device: torch.device):
    """`model.compile`: the training forward compiled (block mask included); the drafter
    itself stays eager for evaluation and owns the weights. Refused, naming the key,
    where torch cannot compile the chosen attention."""
    mode = choice(model_cfg.compile)
    if mode == "off":
        return drafter
    attention = choice(model_cfg.attention)
    if device.type != "cuda" and attention == "flex":
        raise ConfigError("model.compile with model.attention=flex needs CUDA: torch has no "
                          "compiled flex_attention backward on CPU (use model.attention=sdpa)")
    if attention == "chunked":
        raise ConfigError("model.compile with model.attention=chunked: its key windows are "
                          "data-dependent shapes, eager only (use model.attention=sdpa or auto)")
    backend = checked_backend(str(model_cfg.compile_backend))
    return torch.compile(drafter, dynamic=mode == "dynamic", backend=backend)
