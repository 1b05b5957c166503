"""Synthetic chat-like data with the production length profile and learnable tokens.

Lengths: the 902,087-sample production set (65-8191 tokens, mean ~2068, P50 ~1727,
P95 ~4374, P99 ~4917, ~62% in [1024, 4096)) as a piecewise-linear inverse CDF, scaled by
`length_scale` for CPU runs. Tokens: a seeded first-order Markov chain with a few likely
successors per token, so a drafter can learn it and the loss visibly falls.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from dflash.errors import DataError
from dflash.data.format import DatasetWriter, TokenDataset

# Knots (cumulative probability, length) of the production length distribution.
_U = np.array([0, .02, .08, .16, .24, .315, .40, .5, .60, .70, .80, .88, .935, .95, .97,
               .99, .997, 1.0])
_L = np.array([65, 220, 500, 760, 920, 1024, 1360, 1727, 2280, 2900, 3500, 3930, 4096,
               4374, 4700, 4917, 6600, 8191], dtype=np.float64)

PAD_ID, USER_ID, ASSISTANT_ID = 0, 1, 2
FIRST_CONTENT_ID = 3
SUCCESSOR_PROBS = np.array([0.70, 0.15, 0.10, 0.05])


def synthetic_lengths(num_samples: int, length_scale: float = 1.0, min_length: int = 1,
                      seed: int = 0) -> np.ndarray:
    if num_samples < 1:
        raise DataError(f"data.num_samples must be >= 1, got {num_samples}")
    if length_scale <= 0:
        raise DataError(f"data.length_scale must be > 0, got {length_scale}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 101]))
    raw = np.floor(np.interp(rng.random(num_samples), _U, _L) * length_scale)
    return np.maximum(raw.astype(np.int64), max(1, int(min_length)))


PRODUCTION_SAMPLES = 902_087


def production_lengths(num_samples: int = PRODUCTION_SAMPLES, seed: int = 0) -> np.ndarray:
    """The production length profile at full scale (planning benchmarks and tests)."""
    return synthetic_lengths(num_samples, 1.0, 65, seed)


class MarkovSource:
    """Each content token has 4 successors drawn once from the seed, taken with
    probabilities 0.70/0.15/0.10/0.05: predictable enough to learn, not deterministic."""

    def __init__(self, vocab_size: int, seed: int = 0, reserved_top: int = 1):
        # ids [0, 3) are pad/user/assistant markers; the top `reserved_top` ids are left
        # free for the drafter's mask token.
        self.lo, self.hi = FIRST_CONTENT_ID, vocab_size - reserved_top
        if self.hi - self.lo < 8:
            raise DataError(f"data.vocab_size={vocab_size} is too small for synthetic data")
        rng = np.random.default_rng(np.random.SeedSequence([seed, 202]))
        self.succ = rng.integers(self.lo, self.hi, size=(vocab_size, len(SUCCESSOR_PROBS)))
        self.cdf = np.cumsum(SUCCESSOR_PROBS)

    def generate(self, lengths: np.ndarray, rng: np.random.Generator):
        """Token rows for samples of the given lengths: [USER, prompt.., ASSISTANT, reply..];
        the reply (about 70% of each sample) is the supervised part."""
        n, width = len(lengths), int(lengths.max())
        out = np.zeros((n, width), dtype=np.int64)
        cur = rng.integers(self.lo, self.hi, size=n)
        for t in range(width):
            out[:, t] = cur
            pick = np.searchsorted(self.cdf, rng.random(n), side="right")
            cur = self.succ[cur, np.minimum(pick, len(self.cdf) - 1)]
        prompt = np.maximum(1, (lengths * 3) // 10)
        out[:, 0] = USER_ID
        rows = np.arange(n)
        ok = prompt < lengths
        out[rows[ok], prompt[ok]] = ASSISTANT_ID
        cols = np.arange(width)[None, :]
        mask = (cols > prompt[:, None]) & (cols < lengths[:, None])
        return out, mask


def _cache_key(cfg_items: dict) -> str:
    return hashlib.sha1(json.dumps(cfg_items, sort_keys=True).encode()).hexdigest()[:12]


def build_synthetic(num_samples: int, length_scale: float, min_length: int, vocab_size: int,
                    seed: int, lengths: np.ndarray, cache_dir: str | Path,
                    chunk: int = 2048) -> TokenDataset:
    """Write (or reopen) the synthetic data set for exactly these lengths and settings."""
    key = _cache_key({"n": num_samples, "scale": length_scale, "min": min_length,
                      "vocab": vocab_size, "seed": seed, "len_sum": int(lengths.sum()),
                      "len_n": len(lengths), "len_max": int(lengths.max()), "v": 1})
    path = Path(cache_dir) / f"synthetic-{key}"
    if (path / "meta.json").exists():
        return TokenDataset.open(path)
    source = MarkovSource(vocab_size, seed)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 303]))
    writer = DatasetWriter(path, vocab_size, {"source": "synthetic", "seed": seed})
    for s in tqdm(range(0, len(lengths), chunk), desc="synthetic data", unit="chunk",
                  disable=len(lengths) <= 4 * chunk):
        part = lengths[s:s + chunk]
        toks, mask = source.generate(part, rng)
        for r, n in enumerate(part.tolist()):
            writer.add(toks[r, :n], mask[r, :n])
    return writer.close()
