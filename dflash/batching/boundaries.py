"""Bucket boundaries: presets, boundaries computed from the data, validation.

Buckets are half-open [lo, hi): a sample of length L is in bucket j when
boundaries[j] <= L < boundaries[j + 1].
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from dflash.options import choice
from dflash.errors import ConfigError, DataError

COMPUTED = ("geometric", "quantile", "equal_tokens")
PRESET_DIR = Path(__file__).resolve().parents[1] / "conf" / "buckets"  # shipped in the wheel


def check_boundaries(boundaries, lengths: np.ndarray | None = None,
                     source: str = "buckets.boundaries") -> np.ndarray:
    b = np.asarray(boundaries)
    if b.ndim != 1 or len(b) < 2:
        raise DataError(f"{source} needs at least two values (one bucket), got {list(b.ravel())}")
    if b.dtype.kind == "f" and not np.all(b == np.floor(b)):
        raise DataError(f"{source} must be integers, got {list(b)}")
    b = b.astype(np.int64)
    steps = np.diff(b)
    if (steps <= 0).any():
        j = int(np.flatnonzero(steps <= 0)[0])
        what = "duplicate" if steps[j] == 0 else "unsorted"
        raise DataError(f"{source} must be strictly increasing: {what} value {b[j + 1]} "
                        f"after {b[j]} at position {j + 1} in {b.tolist()}")
    if b[0] < 0:
        raise DataError(f"{source} must start at 0 or above, got {b[0]}")
    if lengths is not None:
        low = np.flatnonzero(lengths < b[0])
        high = np.flatnonzero(lengths >= b[-1])
        if len(low) or len(high):
            i = int(low[0]) if len(low) else int(high[0])
            raise DataError(
                f"{source} {b.tolist()} leave {len(low) + len(high)} samples uncovered: sample "
                f"{i} has length {lengths[i]} outside [{b[0]}, {b[-1]})")
    return b


def check_bucket_caps(caps, num_buckets: int, max_batch_size: int,
                      source: str = "buckets.max_batch_size") -> np.ndarray | None:
    """Per-bucket batch size caps as int64, or None for none. One per bucket, each in
    [1, batching.max_batch_size]: the global cap stays the memory limit, a bucket may
    only take fewer rows (where a time fit found that faster)."""
    if caps is None:
        return None
    c = np.asarray(list(caps))
    if c.ndim != 1 or len(c) != num_buckets:
        raise ConfigError(f"{source} needs one cap per bucket ({num_buckets}), got "
                          f"{len(c.ravel())} values: {c.ravel().tolist()}")
    if c.dtype.kind not in "iu":
        raise ConfigError(f"{source} must be integers, got {c.tolist()}")
    bad = np.flatnonzero((c < 1) | (c > max_batch_size))
    if len(bad):
        j = int(bad[0])
        raise ConfigError(f"{source}[{j}] = {int(c[j])} is outside [1, batching.max_batch_size="
                          f"{max_batch_size}]")
    return c.astype(np.int64)


def resolve_bucket_caps(cfg, num_buckets: int, max_batch_size: int) -> np.ndarray | None:
    """The per-bucket caps a buckets config sets (`max_batch_size` in a preset), checked."""
    caps = cfg.get("max_batch_size")
    return check_bucket_caps(None if caps is None else list(caps), num_buckets, max_batch_size,
                             source=f"buckets '{cfg.name}' max_batch_size")


def preset_boundaries(name: str) -> np.ndarray:
    """Boundaries of a fixed preset in conf/buckets/ (the YAML is the one source)."""
    import yaml

    path = PRESET_DIR / f"{name}.yaml"
    if not path.exists():
        raise DataError(f"no bucket preset {name!r} in {PRESET_DIR}")
    doc = yaml.safe_load(path.read_text())
    if not doc.get("boundaries"):
        raise DataError(f"{path} has no fixed boundaries (kind {doc.get('kind')!r})")
    return check_boundaries(doc["boundaries"], source=str(path))


def assign(lengths: np.ndarray, boundaries: np.ndarray) -> np.ndarray:
    """Bucket id (int32) of each length under half-open [lo, hi) buckets."""
    return (np.searchsorted(boundaries, lengths, side="right") - 1).astype(np.int32)


def _finish(inner: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    # First boundary 0 and last one past the longest sample so every sample is covered;
    # equal inner values (ties in the data) collapse into one boundary.
    top = int(lengths.max()) + 1
    inner = np.unique(np.clip(np.round(inner).astype(np.int64), 1, top - 1))
    return np.concatenate([[0], inner, [top]]).astype(np.int64)


def computed_boundaries(kind: str, lengths: np.ndarray, num_buckets: int) -> np.ndarray:
    if num_buckets < 1:
        raise ConfigError(f"buckets.num_buckets must be >= 1, got {num_buckets}")
    k = num_buckets
    if k == 1:
        return _finish(np.zeros(0), lengths)
    srt = np.sort(lengths)
    if kind == "geometric":
        inner = np.geomspace(srt[0], srt[-1] + 1, k + 1)[1:-1]
    elif kind == "quantile":
        # bucket j starts at the length of the sample at rank j*n/k
        inner = srt[(np.arange(1, k) * len(srt)) // k]
    elif kind == "equal_tokens":
        mass = np.cumsum(srt, dtype=np.int64)
        targets = (np.arange(1, k) * int(mass[-1])) // k
        inner = srt[np.searchsorted(mass, targets, side="left")]
    else:
        raise ConfigError(f"buckets.kind must be 'fixed' or one of {COMPUTED}, got {kind!r}")
    return _finish(inner, lengths)


def resolve_boundaries(cfg, lengths: np.ndarray, max_seq_len: int | None = None) -> np.ndarray:
    """The boundaries a buckets config selects, checked against the data.

    With `buckets.cover_max_len` (default) and a `max_seq_len`, the last boundary is raised
    to max_seq_len + 1: the top bucket then holds every length the data config allows
    (`overlong=truncate` makes samples of exactly max_seq_len tokens), also on the next
    data set, whose longest sample a preset fitted elsewhere has never seen. Only the
    top bucket's upper edge moves; batches are padded to their longest sample, so no
    plan on data the preset already covered changes."""
    kind = choice(cfg.kind)
    if kind == "fixed":
        if cfg.boundaries is None:
            raise DataError(f"buckets '{cfg.name}' has kind 'fixed' but no boundaries")
        b = check_boundaries(list(cfg.boundaries), source=f"buckets '{cfg.name}' boundaries")
        source = f"buckets '{cfg.name}' boundaries"
    else:
        b = computed_boundaries(kind, lengths, int(cfg.num_buckets))
        source = f"buckets '{cfg.name}' ({kind}) boundaries"
    if max_seq_len is not None and cfg.get("cover_max_len", True):
        b = b.copy()
        b[-1] = max(int(b[-1]), int(max_seq_len) + 1)
    return check_boundaries(b, lengths, source=source)
