"""Batch planning: strategies, bucket boundaries, plans and their metrics."""
from ..errors import DataError
from .lengths import check_lengths, load_lengths
from .plan import Batch, EpochPlan
from .strategies import STRATEGIES, PackingSpec, Planner, build_planner

__all__ = ["Batch", "DataError", "EpochPlan", "PackingSpec", "Planner", "STRATEGIES",
           "build_planner", "check_lengths", "load_lengths"]
