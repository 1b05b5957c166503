"""Plan quality: padding efficiency, batch-composition repeat and length mixing.

All token counts are int64: one epoch of the production data has ~1.9B useful tokens,
and the seed's bucket search broke on exactly that overflow.
"""
from __future__ import annotations

import numpy as np

from dflash.batching.epoch_plan import EpochPlan


def batch_of_sample(plan: EpochPlan, num_samples: int) -> np.ndarray:
    """Batch index of every sample (-1 where absent; the last batch wins on repeats)."""
    out = np.full(num_samples, -1, dtype=np.int64)
    out[plan.indices] = np.repeat(np.arange(plan.num_batches, dtype=np.int64), plan.batch_sizes)
    return out


def pair_repeat_rate(prev: EpochPlan, nxt: EpochPlan, num_samples: int) -> float:
    """Of the sample pairs sharing a batch in `nxt`, the fraction that shared one in `prev`."""
    sizes = nxt.batch_sizes
    total = int((sizes * (sizes - 1) // 2).sum())
    if total == 0:
        return 0.0
    before = batch_of_sample(prev, num_samples)[nxt.indices]
    now = np.repeat(np.arange(nxt.num_batches, dtype=np.int64), sizes)
    key = now * (prev.num_batches + 1) + (before + 1)
    _, counts = np.unique(key, return_counts=True)
    shared = int((counts * (counts - 1) // 2).sum())
    return shared / total


def length_mixing(plan: EpochPlan, lengths: np.ndarray) -> float:
    """Mean within-batch length std over batches, relative to the std of all lengths."""
    spread = float(lengths.std())
    if spread == 0 or plan.num_batches == 0:
        return 0.0
    x = lengths[plan.indices].astype(np.float64)
    starts = plan.offsets[:-1]
    n = plan.batch_sizes.astype(np.float64)
    mean = np.add.reduceat(x, starts) / n
    var = np.add.reduceat(x * x, starts) / n - mean * mean
    return float(np.sqrt(np.clip(var, 0, None)).mean() / spread)


def bucket_table(plan: EpochPlan, boundaries: np.ndarray) -> list[dict]:
    """Per bucket: its range, samples, batches, mean batch size and padding efficiency."""
    k = len(boundaries) - 1
    sizes = plan.batch_sizes
    batches = np.bincount(plan.bucket, minlength=k)
    samples = np.bincount(plan.bucket, weights=sizes, minlength=k).astype(np.int64)
    useful = np.zeros(k, dtype=np.int64)
    padded = np.zeros(k, dtype=np.int64)
    np.add.at(useful, plan.bucket, plan.num_tokens)
    np.add.at(padded, plan.bucket, plan.batch_rows * plan.seq_len)
    rows = []
    for j in range(k):
        rows.append({
            "lo": int(boundaries[j]), "hi": int(boundaries[j + 1]),
            "samples": int(samples[j]), "batches": int(batches[j]),
            "mean_batch_size": float(samples[j] / batches[j]) if batches[j] else 0.0,
            "efficiency": float(useful[j] / padded[j]) if padded[j] else 0.0,
            "useful_tokens": int(useful[j]), "padded_tokens": int(padded[j]),
        })
    return rows


def format_table(rows: list[dict], columns: list[str], title: str | None = None) -> str:
    """A plain fixed-width table for terminals and logs."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.4f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)
    body = [[cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c)
              for i, c in enumerate(columns)]
    lines = [title] if title else []
    lines.append("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)
