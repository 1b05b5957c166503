"""Builds the data a run needs from the `data` config group."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dflash.data.lengths import check_lengths, load_lengths
from dflash.options import choice
from dflash.errors import DataError
from dflash.data.format import TokenDataset
from dflash.data.overlong import apply_to_lengths, check_policy
from dflash.data.synthetic import build_synthetic, synthetic_lengths

SOURCES = ("world", "synthetic", "tokenized", "lengths")


@dataclass
class Data:
    lengths: np.ndarray  # int64, one per sample the planner sees
    dataset: TokenDataset | None  # None when only lengths are known
    info: dict = field(default_factory=dict)
    # original sample id of each planned sample when overlong samples were dropped from
    # a lengths file (plans index the kept samples; dumps report original ids)
    original_ids: np.ndarray | None = None


def load_data(cfg, lengths_file: str | None = None, need_tokens: bool = False) -> Data:
    """Lengths (always) and tokens (when `need_tokens`) for the configured source.

    `lengths_file` (the plan/buckets apps' argument) overrides the data group.
    """
    policy, source = choice(cfg.overlong), choice(cfg.source)
    check_policy(policy)
    if lengths_file is not None:
        return _lengths_only(load_lengths(lengths_file), cfg, str(lengths_file))
    if source not in SOURCES:
        raise DataError(f"data.source must be one of {SOURCES}, got {source!r}")
    if source == "lengths":
        return _lengths_only(load_lengths(cfg.path), cfg, str(cfg.path))
    if source == "tokenized":
        if not cfg.path:
            raise DataError("data=tokenized needs data.path=DIR (a data set written by "
                            "python -m dflash.data.prepare)")
        ds = TokenDataset.open(cfg.path)
        lengths = check_lengths(ds.lengths, source=str(cfg.path))
        over = lengths > cfg.max_seq_len
        if over.any():
            # Token files are not rewritten at load; prepare applies truncate/drop.
            i = int(np.argmax(over))
            raise DataError(f"{cfg.path}: sample {i} has {int(lengths[i])} tokens, more than "
                            f"data.max_seq_len={cfg.max_seq_len}; re-run prepare with that limit")
        return Data(lengths, ds, {"source": "tokenized", "path": str(cfg.path),
                                  "num_samples": len(lengths)})
    raw = synthetic_lengths(cfg.num_samples, cfg.length_scale, cfg.min_length, cfg.seed)
    lengths, _, report = apply_to_lengths(raw, cfg.max_seq_len, policy, f"{source} data")
    info = {"source": source, "num_samples": len(lengths), **report.as_dict()}
    ds = None
    if need_tokens and source == "world":
        # the world's tokens need its fitted target: dflash.sources.build builds them
        raise DataError("data=world tokens are built by the training run (dflash.sources.build)")
    if need_tokens:
        ds = build_synthetic(cfg.num_samples, cfg.length_scale, cfg.min_length, cfg.vocab_size,
                             cfg.seed, lengths, cfg.cache_dir)
    return Data(lengths, ds, info)


def _lengths_only(lengths: np.ndarray, cfg, source: str) -> Data:
    kept_before = len(lengths)
    lengths, keep, report = apply_to_lengths(lengths, cfg.max_seq_len, choice(cfg.overlong), source)
    return Data(lengths, None, {"source": "lengths", "path": source,
                                "num_samples": len(lengths), **report.as_dict()},
                original_ids=keep if len(keep) != kept_before else None)
