"""Rows of a strategy comparison: one per job, then one per strategy over its seeds.

A job's label is the overrides its sweep varied; its group is that label without
`seed`, so the seeds of one strategy form one group and the same seed pairs the groups
(the same drafter init and eval prompts). Per group every metric is a mean with a 95%
interval over seeds; each group is judged against the best one on paired differences.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dflash.comparison.stats import bootstrap_acceptance, first_crossing, interval, paired_verdict
from dflash.run_summary import RunSummary

# (metric, higher is better, unit in verdicts): what each group is judged on
JUDGED = (("acceptance_length", True, ""), ("acceptance_at_equal_time", True, ""),
          ("time_to_target", False, " s"), ("tokens_per_second", True, " tok/s"))
AGGREGATED = ("acceptance_length", "acceptance_at_equal_time", "time_to_target",
              "steps_to_target", "tokens_per_second", "padding_efficiency", "final_loss",
              "pair_repeat_rate", "length_mixing", "train_seconds", "real_tokens")


def curve(s: RunSummary) -> np.ndarray:
    """[[training seconds, steps, real tokens, acceptance]] from the run's start to its end."""
    pts = [(0.0, 0, 0, s.initial_acceptance_length)]
    pts += [(p["train_seconds"], p["step"], p.get("real_tokens", 0), p["acceptance_length"])
            for p in s.eval_curve or []]
    pts.append((s.train_seconds or 0.0, s.steps or 0, s.real_tokens or 0, s.acceptance_length))
    return np.asarray(sorted(p for p in pts if p[3] is not None), dtype=np.float64).reshape(-1, 4)


def job_summaries(sweep_dir: Path) -> list[tuple[dict, RunSummary]]:
    """(overrides, summary) of every finished job under the sweep dir, in job order."""
    paths = sorted(Path(sweep_dir).glob("*/summary.json"), key=lambda p: _job_num(p.parent.name))
    sums = [RunSummary.from_json(json.loads(p.read_text())) for p in paths]
    return [(dict(o.split("=", 1) for o in s.overrides or [] if "=" in o), s) for s in sums]


def _job_num(name: str) -> int:
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else 1 << 30


def job_rows(jobs: list[tuple[dict, RunSummary]], target: float | None = None) -> list[dict]:
    """One row per job (the comparison.json contract: strategy, padding efficiency,
    tokens/s, pair repeat, length mixing, final loss, acceptance), plus its group, seed,
    the eval's bootstrap interval, acceptance at equal time and time to `target`."""
    if not jobs:
        return []
    keys = sorted({k for o, _ in jobs for k in o})
    varied = [k for k in keys if len({o.get(k) for o, _ in jobs}) > 1]
    t_equal = min(s.train_seconds or 0.0 for _, s in jobs)
    finals = [s.acceptance_length for _, s in jobs if s.acceptance_length is not None]
    if target is None and finals:
        target = min(finals)  # every job reaches it
    rows = []
    for o, s in jobs:
        c = curve(s)
        after = (s.eval or {}).get("after") or {}
        group = ",".join(f"{k}={o[k]}" for k in varied if k in o and k != "seed")
        reach = first_crossing(c[:, 0], c[:, 3], target) if len(c) and target is not None else None
        rows.append({
            "run": ",".join(f"{k}={o[k]}" for k in varied if k in o) or s.run_name,
            "group": group or s.strategy, "seed": s.seed, "strategy": s.strategy,
            "padding_efficiency": s.padding_efficiency, "tokens_per_second": s.tokens_per_second,
            "pair_repeat_rate": s.pair_repeat_rate, "length_mixing": s.length_mixing,
            "final_loss": s.final_loss, "acceptance_length": s.acceptance_length,
            "acceptance_bootstrap": bootstrap_acceptance(after.get("per_prompt"),
                                                         after.get("per_prompt_steps")),
            "acceptance_at_equal_time": float(np.interp(t_equal, c[:, 0], c[:, 3])) if len(c) else None,
            "equal_time_seconds": t_equal, "target_acceptance": target,
            "time_to_target": reach,
            "steps_to_target": first_crossing(c[:, 1], c[:, 3], target) if reach is not None else None,
            "train_seconds": s.train_seconds, "steps": s.steps,
            "predicted_train_seconds": s.predicted_train_seconds,
            "real_tokens": s.real_tokens, "loss_norm": s.loss_norm, "curve": c.tolist()})
    return rows


def group_rows(rows: list[dict]) -> list[dict]:
    """One row per group: every metric as {mean, lo, hi, n} over its seeds; the verdict
    of the best group against each other one, per judged metric."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    out = []
    for name, rs in groups.items():
        g = {"group": name, "strategy": rs[0]["strategy"], "seeds": [r["seed"] for r in rs],
             "reached_target": sum(r["time_to_target"] is not None for r in rs)}
        g.update({k: interval([r[k] for r in rs]) for k in AGGREGATED})
        g["by_seed"] = {k: {r["seed"]: r[k] for r in rs} for k, _, _ in JUDGED}
        out.append(g)
    for metric, higher, unit in JUDGED:
        scored = [g for g in out if g[metric]["mean"] is not None]
        if not scored:
            continue
        best = (max if higher else min)(scored, key=lambda g: g[metric]["mean"])
        for g in out:
            g.setdefault("verdicts", {})[metric] = (
                {"verdict": "best", "against": None} if g is best else
                {**paired_verdict(best["by_seed"][metric], g["by_seed"][metric], higher, unit),
                 "against": best["group"]})
    return out


def eval_noise(rows: list[dict]) -> float | None:
    """Median half-width of the jobs' bootstrap intervals of acceptance."""
    widths = [r["acceptance_bootstrap"]["half_width"] for r in rows if r["acceptance_bootstrap"]]
    return float(np.median(widths)) if widths else None
