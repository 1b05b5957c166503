"""Loading and checking sample lengths: every planner input passes through here."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from dflash.errors import ConfigError, DataError


def check_lengths(lengths, source: str = "lengths") -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise DataError(f"{source}: expected a 1-D array of sample lengths, got shape {arr.shape}")
    if arr.size == 0:
        raise DataError(f"{source}: no samples (empty lengths array)")
    if arr.dtype.kind == "f":
        bad = np.flatnonzero(arr != np.floor(arr))
        if len(bad) or not np.isfinite(arr).all():
            i = int(bad[0]) if len(bad) else int(np.flatnonzero(~np.isfinite(arr))[0])
            raise DataError(f"{source}: sample {i} has non-integer length {arr[i]!r}")
    elif arr.dtype.kind not in "iu":
        raise DataError(f"{source}: lengths must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.min() < 1:
        i = int(np.argmin(arr))
        raise DataError(f"{source}: sample {i} has length {arr[i]}; lengths must be >= 1")
    return arr


def load_lengths(path: str | Path) -> np.ndarray:
    path = Path(path)
    if not path.exists():
        raise DataError(f"lengths file not found: {path}")
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises several types for a bad file
        raise DataError(f"lengths file {path} is not a readable .npy array: {exc}") from exc
    return check_lengths(arr, source=str(path))


def check_fits_budget(lengths: np.ndarray, token_budget: int, source: str = "data") -> None:
    if token_budget < 1:
        raise ConfigError(f"batching.token_budget must be >= 1, got {token_budget}")
    longest = int(lengths.max())
    if longest > token_budget:
        i = int(np.argmax(lengths))
        raise DataError(f"{source}: sample {i} has length {longest}, more than "
                        f"batching.token_budget={token_budget}; raise the budget or lower "
                        "data.max_seq_len")
