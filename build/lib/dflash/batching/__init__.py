"""Batch planning: strategies, bucket boundaries, plans and their metrics."""
from dflash.errors import DataError
from dflash.data.lengths import check_lengths, load_lengths
from dflash.batching.epoch_plan import Batch, EpochPlan
from dflash.batching.strategies import STRATEGIES, PackingSpec, Planner, build_planner

__all__ = ["Batch", "DataError", "EpochPlan", "PackingSpec", "Planner", "STRATEGIES",
           "build_planner", "check_lengths", "load_lengths"]
