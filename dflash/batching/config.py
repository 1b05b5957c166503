"""The `batching` and `buckets` groups' schemas: how samples become batches."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from dflash.batching.boundaries import COMPUTED
from dflash.batching.distributed import REMAINDERS
from dflash.batching.strategies import STRATEGIES
from dflash.options import options

Strategy = options("Strategy", STRATEGIES)
Remainder = options("Remainder", REMAINDERS)
BucketKind = options("BucketKind", ("fixed", *COMPUTED))


@dataclass
class BatchingConfig:
    strategy: Strategy = Strategy.bucketed  # sorted | random | bucketed | megabatch | packed
    token_budget: int = 49152  # padded tokens per batch (per rank)
    max_batch_size: int = 64  # samples per batch at most
    # Windows of this many batches' worth of samples are sorted before packing
    # (megabatch always; bucketed when > 0).
    sort_window: int = 0
    # What happens when batches do not divide evenly over data-parallel ranks:
    # repeat: the first batches of the epoch are repeated to fill the last step;
    # drop: the last batches are dropped (and counted in the report).
    remainder: Remainder = Remainder.repeat
    # Deal each data-parallel step batches of similar cost (fewer stragglers, less
    # within-step length diversity); cost = padded tokens * (1 + attention_cost * length).
    balance_steps: bool = False
    attention_cost: float = 3.7e-5  # per-token attention weight in the step cost
    # packed: rows of row_len tokens (0: data.max_seq_len), token_budget // row_len rows
    # a batch but no more than max_batch_size documents a batch on average, first fit
    # over pack_window open rows (batching/packed_rows.py)
    row_len: int = 0
    pack_window: int = 32  # packed: open rows searched for a fit
    # anchor slots per packed row; 0: as many as the row's documents would get unpacked
    # (packed_rows.anchor_slots_per_row)
    anchors_per_row: int = 0


@dataclass
class BucketsConfig:
    name: str = "seed6"  # the preset's name
    # fixed: use `boundaries`; geometric | quantile | equal_tokens: computed from the data.
    kind: BucketKind = BucketKind.fixed
    boundaries: Optional[List[int]] = None  # kind=fixed: the bucket edges
    num_buckets: int = 6  # computed kinds: how many buckets
    # raise the last boundary to data.max_seq_len + 1, so the top bucket holds every
    # length the data config allows (see batching/boundaries.py resolve_boundaries)
    cover_max_len: bool = True
    # batching=bucketed: a batch size cap per bucket, each <= batching.max_batch_size
    # (`python -m dflash.buckets ... cost=FILE` writes one where smaller batches are
    # predicted faster); null: batching.max_batch_size for every bucket
    max_batch_size: Optional[List[int]] = None
    meta: Dict[str, Any] = field(default_factory=dict)
