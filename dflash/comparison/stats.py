"""The statistics of a strategy comparison: intervals over seeds, paired differences,
the eval's own noise, and when a run first reaches a target acceptance.

Seeds are paired: seed s gives every strategy the same drafter init and the same eval
prompts, so strategy A against B is judged on the per-seed differences A(s) - B(s).
Intervals are Student-t 95% intervals over seeds; with one seed there is none.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats as _st


def interval(values) -> dict:
    """Mean and 95% t-interval over seeds ({mean, lo, hi, n}); lo/hi None for n < 2."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    n = len(v)
    if n == 0:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    mean = float(v.mean())
    if n < 2:
        return {"mean": mean, "lo": None, "hi": None, "n": 1}
    half = float(_st.t.ppf(0.975, n - 1) * v.std(ddof=1) / math.sqrt(n))
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}


def paired_verdict(best: dict, other: dict, higher_is_better: bool, unit: str = "") -> dict:
    """`best` against `other` on the seeds both have ({seed: value}): the mean paired
    difference (best better: positive) with its 95% interval, and a verdict that names a
    difference only when the interval excludes zero."""
    seeds = sorted(s for s in best if s in other and best[s] is not None and other[s] is not None)
    sign = 1.0 if higher_is_better else -1.0
    diff = interval([sign * (best[s] - other[s]) for s in seeds])
    if diff["n"] < 2:
        text = "one seed: no interval, no verdict"
    elif diff["lo"] > 0:
        text = (f"better by {diff['mean']:.3g}{unit} (95% CI {diff['lo']:.3g} to "
                f"{diff['hi']:.3g}, {diff['n']} paired seeds)")
    else:
        text = (f"no difference detectable at this budget ({diff['mean']:+.3g}{unit}, 95% CI "
                f"{diff['lo']:.3g} to {diff['hi']:.3g}, {diff['n']} paired seeds)")
    return {**diff, "verdict": text, "significant": bool(diff["n"] >= 2 and diff["lo"] > 0)}


def pooled_acceptance(per_prompt: np.ndarray, steps: np.ndarray, pick) -> np.ndarray:
    """Acceptance pooled over the prompts `pick` selects (its last axis): total accepted
    over total verify steps, so a prompt weighs by the steps it took."""
    return (per_prompt[pick] * steps[pick]).sum(-1) / np.maximum(steps[pick].sum(-1), 1)


def bootstrap_acceptance(per_prompt: list, steps: list, draws: int = 2000,
                         seed: int = 0) -> dict | None:
    """95% bootstrap interval over prompts of the pooled acceptance length (total
    accepted over total verify steps): the eval's own noise on these prompts."""
    if not per_prompt or not steps or len(per_prompt) != len(steps):
        return None
    mean = np.asarray(per_prompt, dtype=np.float64)
    n = np.asarray(steps, dtype=np.float64)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(mean), (draws, len(mean)))
    lo, hi = np.percentile(pooled_acceptance(mean, n, pick), [2.5, 97.5])
    return {"lo": float(lo), "hi": float(hi), "half_width": float((hi - lo) / 2),
            "prompts": len(mean)}


def first_crossing(xs, ys, target: float):
    """The first x where the piecewise-linear curve (xs, ys) reaches `target`; None if
    it never does."""
    xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    for i in range(len(ys)):
        if ys[i] >= target:
            if i == 0:
                return float(xs[0])
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return float(x0 + (target - y0) / (y1 - y0) * (x1 - x0))
    return None
