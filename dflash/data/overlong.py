"""What to do with samples longer than data.max_seq_len: truncate, drop or error."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash.errors import ConfigError, DataError

POLICIES = ("truncate", "drop", "error")


@dataclass
class OverlongReport:
    policy: str
    max_seq_len: int
    count: int = 0  # samples over the limit (truncated or dropped)
    tokens_removed: int = 0
    # truncated samples dropped because the cut removed every supervised token
    dropped_unsupervised: int = 0

    def as_dict(self) -> dict:
        return {"policy": self.policy, "max_seq_len": self.max_seq_len,
                "overlong_samples": self.count, "tokens_removed": self.tokens_removed,
                "dropped_unsupervised": self.dropped_unsupervised}


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ConfigError(f"data.overlong must be one of {POLICIES}, got {policy!r}")


def apply_to_lengths(lengths: np.ndarray, max_seq_len: int, policy: str,
                     source: str = "data") -> tuple[np.ndarray, np.ndarray, OverlongReport]:
    """(new lengths, ids of the kept samples, report)."""
    check_policy(policy)
    over = lengths > max_seq_len
    report = OverlongReport(policy, int(max_seq_len), int(over.sum()),
                            int((lengths[over] - max_seq_len).sum(dtype=np.int64)))
    keep = np.arange(len(lengths), dtype=np.int64)
    if not report.count:
        return lengths, keep, report
    if policy == "error":
        i = int(np.flatnonzero(over)[0])
        raise DataError(f"{source}: sample {i} has {int(lengths[i])} tokens, more than "
                        f"data.max_seq_len={max_seq_len} ({report.count} samples are over; "
                        "set data.overlong=truncate or drop)")
    if policy == "truncate":
        return np.minimum(lengths, max_seq_len), keep, report
    if over.all():
        raise DataError(f"{source}: data.overlong=drop would drop all {len(lengths)} samples "
                        f"(the shortest has {int(lengths.min())} tokens, more than "
                        f"data.max_seq_len={max_seq_len}): raise data.max_seq_len")
    report.tokens_removed = int(lengths[over].sum(dtype=np.int64))
    return lengths[~over], keep[~over], report
