"""The torch.compile backend a run asks for, checked before any work is done."""
from __future__ import annotations

import torch

from dflash.errors import ConfigError


def checked_backend(name: str) -> str:
    """`model.compile_backend`, refused naming the key when torch has no such backend
    (a typo would otherwise surface as dynamo's error at the first compiled step)."""
    known = torch._dynamo.list_backends(exclude_tags=())
    if name not in known:
        raise ConfigError(f"model.compile_backend={name} is not a torch.compile backend "
                          f"(one of {', '.join(known)})")
    return name
