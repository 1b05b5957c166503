"""Learning-rate multipliers: linear warmup, then cosine decay (the drafter's AdamW in
dflash.optim and the world target's fit in dflash.sources.world both read it)."""
from __future__ import annotations

import math


def warmup_cosine(step: int, total: int, warmup_ratio: float, min_ratio: float = 0.0, *,
                  warmup_steps: int | None = None, decay_during_warmup: bool = False) -> float:
    """LR multiplier at `step` (0-based) of `total`: linear warmup over
    ceil(total x warmup_ratio) steps (or `warmup_steps`), then cosine to `min_ratio`.
    `decay_during_warmup`: the cosine spans all `total` steps and the warmup ramp scales
    it (the world target's fit), instead of the cosine starting where the warmup ends."""
    warm = max(1, int(math.ceil(total * warmup_ratio)) if warmup_steps is None else warmup_steps)
    if decay_during_warmup:
        cos = 0.5 * (1 + math.cos(math.pi * step / total))
        return min(1.0, (step + 1) / warm) * (min_ratio + (1 - min_ratio) * cos)
    if step < warm:
        return (step + 1) / warm
    t = min(1.0, (step - warm) / max(1, total - warm))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))
