"""What a trained drafter is measured against, on the same prompts by the same decoder.

    untrained  a fresh drafter of the checkpoint's own shape (seed 0): what training bought
    lookup     prompt lookup decoding (the continuation of the latest earlier match of the
               last tokens), blocks of the drafter's size: free, no training
    ngram      the most frequent next token after the longest matching suffix, counted
               over a data set's supervised tokens (`ngram_data=DIR`, the training set)

Each is scored with its own 95% bootstrap interval over prompts, and the drafter against
it by a paired bootstrap of the difference (the same prompt resampled for both), so
"beats the baseline" is a statement with an interval, not two numbers side by side.
"""
from __future__ import annotations

import numpy as np
import torch

from dflash.comparison.stats import pooled_acceptance
from dflash.errors import ConfigError
from dflash.eval.report import Difference
from dflash.model.dspark import num_drafts
from dflash.decode import DrafterProposer, NgramProposer, PromptLookupProposer

BASELINES = ("untrained", "lookup", "ngram")


def untrained_like(drafter):
    """A fresh drafter of `drafter`'s spec (seed 0), the same for every caller."""
    from dflash.model.drafter import DFlashDrafter
    with torch.random.fork_rng(devices=[]):  # the caller's RNG stream stays its own
        torch.manual_seed(0)
        fresh = DFlashDrafter(drafter.spec)
    if fresh.markov_head is not None:  # W2's rows: the same draft vocabulary's ids
        fresh.markov_head.ids = drafter.markov_head.ids
    return fresh


def check_baseline(name: str, ngram_data: str | None = None) -> None:
    """Baseline `name`'s own inputs, read before the target loads: a known name, the
    n-gram baseline's data set, another drafter's files."""
    from dflash.model.checkpoint import drafter_config
    if name == "ngram":
        if not ngram_data:
            raise ConfigError("baselines=[ngram] counts a data set's tokens: set "
                              "ngram_data=DIR (the training set)")
        from dflash.data.format import TokenDataset
        TokenDataset.open(ngram_data)
    elif name.startswith("drafter:"):
        drafter_config(name[len("drafter:"):])
    elif name not in BASELINES:
        raise ConfigError(f"baselines: unknown baseline {name!r} (one of {', '.join(BASELINES)}, "
                          "drafter:DIR)")


def build_baseline(name: str, drafter, target, ngram_data: str | None = None):
    """The proposer of baseline `name`, sized like `drafter` (as many drafts a block)."""
    check_baseline(name, ngram_data)
    bs = num_drafts(drafter.spec) + 1
    if name == "untrained":
        fresh = untrained_like(drafter).to(target.lm_head_weight.device).eval()
        return DrafterProposer(fresh, target)
    if name == "lookup":
        return PromptLookupProposer(block_size=bs)
    if name == "ngram":
        from dflash.data.format import TokenDataset
        ds = TokenDataset.open(ngram_data)
        rows = [ds.sample(i) for i in range(len(ds))]
        return NgramProposer([t for t, _ in rows], [m for _, m in rows], block_size=bs)
    # another trained drafter (drafter:DIR): an A/B on the same prompts
    return DrafterProposer(other_drafter(name[len("drafter:"):], drafter, target), target)


def other_drafter(path: str, drafter, target):
    """A second drafter checkpoint (`baselines=[drafter:DIR]`), refused in one line where
    it reads other target layers than the drafter under test (they share one context)."""
    from dflash.model.checkpoint import load_drafter
    other = load_drafter(path, target.lm_head_weight.device).eval()
    if list(other.spec.target_layer_ids) != list(drafter.spec.target_layer_ids):
        raise ConfigError(f"baselines=[drafter:{path}]: it taps target layers "
                          f"{list(other.spec.target_layer_ids)}, the drafter under test "
                          f"{list(drafter.spec.target_layer_ids)}: an A/B shares one target context")
    return other


def paired_difference(a, b, draws: int = 2000, seed: int = 0) -> Difference:
    """Pooled acceptance of `a` minus `b` (Scores of the same prompts), with a 95% paired
    bootstrap interval over prompts."""
    pa, na = np.asarray(a.per_prompt), np.asarray(a.per_prompt_steps, dtype=np.float64)
    pb, nb = np.asarray(b.per_prompt), np.asarray(b.per_prompt_steps, dtype=np.float64)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(pa), (draws, len(pa)))
    diff = pooled_acceptance(pa, na, pick) - pooled_acceptance(pb, nb, pick)
    lo, hi = np.percentile(diff, [2.5, 97.5])
    every = np.arange(len(pa))
    return Difference(float(pooled_acceptance(pa, na, every) - pooled_acceptance(pb, nb, every)),
                      float(lo), float(hi), bool(lo > 0))
