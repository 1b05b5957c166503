"""The `warmup` group's schema: which shapes are compiled before step 1."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from dflash.options import options
from dflash.warmup.monitor import ON_COMPILE
from dflash.warmup.shapes import POLICIES

WarmupPolicy = options("WarmupPolicy", POLICIES)
OnCompile = options("OnCompile", ON_COMPILE)


@dataclass
class WarmupConfig:
    # which planned shapes are warmed before step 1 (every batch then runs at the
    # cheapest warmed shape holding it): none | bucket_max (one per bucket) | top_k (most
    # frequent) | coverage (smallest set covering `coverage` of steps) | all
    policy: WarmupPolicy = WarmupPolicy.all
    pad_to_multiple: int = 64  # padded lengths round up to this (the model group sets it)
    batch_sizes: List[int] = field(default_factory=list)  # a batch-size menu; []: plan's own
    top_k: int = 8  # top_k: warm this many most frequent shapes
    coverage: float = 0.99  # coverage: warm the fewest shapes holding this share of steps
    envelope: bool = True  # top_k / coverage also warm each bucket's envelope shape
    # a compile or autotune run after warmup: warn (counted in summary.json) or stop
    on_compile: OnCompile = OnCompile.warn
