"""DSpark against plain DFlash on the CPU world, read from one `compare_dspark` sweep.

    python -m dflash.train -m experiment=compare_dspark
    python benchmarks/dspark_world.py outputs/multirun/DATE/compare_dspark-TIME

Prints (from the sweep's comparison.json and each job's summary.json): the groups'
acceptance at equal real tokens and at equal training time with 95% intervals over the
paired seeds; the paired differences that answer the question (DSpark against DFlash at
1 and 2 layers, a 1-layer DSpark against a 2-layer DFlash); the per-position acceptance
decoded on the held-out prompts (P(>= k drafts), and the conditional P(k | k-1) where
the suffix decay shows); and the confidence head's calibration per slot, over seeds.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash.comparison.stats import interval, paired_verdict  # noqa: E402
from dflash.comparison.table import job_summaries  # noqa: E402
from dflash.eval.teacher_forced import decoded_per_position  # noqa: E402


def _ci(v: dict, fmt="{:.2f}") -> str:
    if v["mean"] is None:
        return "-"
    if v["lo"] is None:
        return fmt.format(v["mean"])
    return f"{fmt.format(v['mean'])} ({fmt.format(v['lo'])}-{fmt.format(v['hi'])})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path)
    a = ap.parse_args()
    rows = json.loads((a.sweep / "comparison.json").read_text())
    by = {}
    for r in rows:
        by.setdefault(r["group"], {})[r["seed"]] = r
    jobs = {(",".join(f"{k}={o[k]}" for k in sorted(o) if k not in ("seed",)), s.seed): s
            for o, s in job_summaries(a.sweep)}

    def label(g):
        kv = dict(x.split("=", 1) for x in g.split(","))
        return f"{kv.get('drafter_head', '?')}, {kv.get('model.drafter.num_layers', '?')} layer(s)"

    print(f"sweep {a.sweep}: {len(rows)} jobs")
    print("\n| drafter | acceptance at equal real tokens (95% CI) | per seed | acceptance at equal "
          "time | real tokens/s | s a job |")
    print("| --- | --- | --- | --- | --- | --- |")
    for g, seeds in sorted(by.items()):
        acc = [seeds[s]["acceptance_length"] for s in sorted(seeds)]
        print(f"| {label(g)} | {_ci(interval(acc))} | {', '.join(f'{x:.2f}' for x in acc)} | "
              f"{_ci(interval([seeds[s]['acceptance_at_equal_time'] for s in seeds]))} | "
              f"{_ci(interval([seeds[s]['tokens_per_second'] for s in seeds]), '{:,.0f}')} | "
              f"{_ci(interval([seeds[s]['train_seconds'] for s in seeds]), '{:.0f}')} |")
    groups = {label(g): g for g in by}
    print("\n| paired difference (3 seeds) | at equal real tokens | at equal time |")
    print("| --- | --- | --- |")
    for a_, b_ in (("dspark, 1 layer(s)", "dflash, 1 layer(s)"),
                   ("dspark, 2 layer(s)", "dflash, 2 layer(s)"),
                   ("dspark, 1 layer(s)", "dflash, 2 layer(s)")):
        if a_ not in groups or b_ not in groups:
            continue
        x, y = by[groups[a_]], by[groups[b_]]
        cells = []
        for key in ("acceptance_length", "acceptance_at_equal_time"):
            v = paired_verdict({s: r[key] for s, r in x.items()}, {s: r[key] for s, r in y.items()},
                               True)
            cells.append(f"{v['mean']:+.2f} ({v['lo']:+.2f} to {v['hi']:+.2f})"
                         + (" **better**" if v["significant"] else
                            " worse" if v["hi"] is not None and v["hi"] < 0 else ""))
        print(f"| {a_} minus {b_} | {cells[0]} | {cells[1]} |")
    # per position, decoded on the held-out prompts: mean over seeds
    print("\nP(>= k drafts accepted), decoded on the held-out prompts, mean over seeds:")
    curves, cals = {}, {}
    for (g, seed), s in jobs.items():
        after = (s.get("eval") or {}).get("after") or {}
        name = label(g)
        curves.setdefault(name, []).append(decoded_per_position(after.get("histogram") or []))
        if after.get("calibration"):
            cals.setdefault(name, []).append(after["calibration"])
    width = max(len(c[0]) for c in curves.values())
    show = list(range(min(width, 10)))
    print("| drafter | " + " | ".join(f"k={k + 1}" for k in show) + " |")
    print("| --- |" + " --- |" * len(show))
    for name in sorted(curves):
        m = np.mean(np.asarray(curves[name]), axis=0)
        print(f"| {name} | " + " | ".join(f"{m[k]:.3f}" for k in show) + " |")
    print("\nP(k accepted | k-1 accepted) (the suffix decay):")
    print("| drafter | " + " | ".join(f"k={k + 1}" for k in show) + " |")
    print("| --- |" + " --- |" * len(show))
    for name in sorted(curves):
        m = np.mean(np.asarray(curves[name]), axis=0)
        cond = [m[0]] + [m[k] / m[k - 1] if m[k - 1] > 0 else float("nan") for k in range(1, len(m))]
        print(f"| {name} | " + " | ".join(f"{cond[k]:.2f}" for k in show) + " |")
    for name, cs in sorted(cals.items()):
        print(f"\nconfidence head calibration, {name} (held-out prompts, teacher forced along "
              f"the decoded tokens; mean over {len(cs)} seeds; ECE "
              f"{_ci(interval([c['ece'] for c in cs]), '{:.3f}')}):")
        print("| slot k | " + " | ".join(str(k + 1) for k in show) + " |")
        print("| --- |" + " --- |" * len(show))
        for key in ("trials", "predicted", "observed"):
            vals = []
            for k in show:
                xs = [c["per_slot"][k][key] for c in cs if k < len(c["per_slot"])
                      and c["per_slot"][k][key] is not None]
                vals.append("-" if not xs else (f"{sum(xs)}" if key == "trials"
                                                else f"{np.mean(xs):.2f}"))
            print(f"| {key} | " + " | ".join(vals) + " |")


if __name__ == "__main__":
    main()
