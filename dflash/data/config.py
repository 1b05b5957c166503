"""The `data` group's schema: where samples come from and how long they may be."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dflash.data.build import SOURCES
from dflash.data.overlong import POLICIES as OVERLONG
from dflash.options import options

Source = options("Source", SOURCES)
Overlong = options("Overlong", OVERLONG)


@dataclass
class DataConfig:
    # synthetic: generated on the fly (cached on disk); tokenized: a directory written by
    # `dflash.data.prepare`; lengths: a 1-D .npy of sample lengths (planning only).
    source: Source = Source.synthetic
    path: Optional[str] = None  # tokenized: the data set dir; lengths: the .npy file
    num_samples: int = 2000  # synthetic / world: how many samples
    # Synthetic lengths follow the production profile scaled by this factor, so CPU runs
    # keep the shape of the distribution at a fraction of the tokens.
    length_scale: float = 0.0625
    min_length: int = 16  # synthetic / world: the shortest sample
    vocab_size: int = 512  # synthetic / world: token ids drawn below this
    max_seq_len: int = 8192  # a sample longer than this meets `overlong`
    overlong: Overlong = Overlong.error  # truncate | drop | error, for samples over max_seq_len
    seed: int = 0  # synthetic / world: the data's seed
    # where generated data and the fitted world target are cached
    cache_dir: str = "${dirs.cache}"
    # world: motif slots and the token range of each slot; steps to fit the tiny target
    period: int = 8
    slot_size: int = 8
    target_fit_steps: int = 500  # world: training steps that fit its tiny target
    # world: rows of 96 tokens a fit step takes (every other step a quarter as many rows
    # of 384); the test suite's small world fits at 16, in two thirds of the time
    target_fit_batch: int = 32
