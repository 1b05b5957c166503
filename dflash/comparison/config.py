"""The `compare` section's schema: what a comparison sweep judges time on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class CompareConfig:
    # the acceptance length whose wall time (and steps) each strategy of a comparison
    # sweep is judged on; None: the lowest final acceptance of any job (all reach it)
    target_acceptance: Optional[float] = None
