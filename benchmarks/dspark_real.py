"""DSpark against DFlash on the real-model recipe (SmolLM2-135M-Instruct), same data.

    make train-real ARGS="budget_minutes=30"             # DFlash (the recipe's drafter)
    cp $R/eval.json $R/eval_dflash.json                  # R=.cache/dflash/end_to_end/smollm2
    make train-real ARGS="estimate=false prompts=N paths=M train.groups.loss=dspark +train.groups.drafter_head=dspark"
    python benchmarks/dspark_real.py --workdir $R --dflash $R/train-A --dspark $R/train-B

(N, M: the prompts and paths the first run scaled to.) Walks both drafters along the
held-out greedy replies (`dflash.eval paths=` with `baselines=[drafter:DFLASH]`: one
paired interval over the same replies), then prints the decoded per-position acceptance
of both on the held-out prompts (P(>= k drafts) and the conditional P(k | k-1), where the
suffix decay shows) and the DSpark drafter's confidence calibration.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dflash.eval.teacher_forced import decoded_per_position  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--dflash", type=Path, required=True, help="the DFlash arm's run dir")
    ap.add_argument("--dspark", type=Path, required=True, help="the DSpark arm's run dir")
    ap.add_argument("--target", type=Path, default=ROOT / ".cache/dflash/smollm2-135m-instruct")
    a = ap.parse_args()
    w = a.workdir
    out = w / "paths_dspark_vs_dflash.json"
    subprocess.run([sys.executable, "-m", "dflash.eval", f"drafter={a.dspark / 'drafter'}",
                    "model=hf", f"model.target.path={a.target}", "model.target.dtype=native",
                    f"paths={w / 'heldout_data'}", f"baselines=[drafter:{a.dflash / 'drafter'}]",
                    f"out={out}", f"hydra.run.dir={w / 'paths_ab'}"], check=True, cwd=ROOT,
                   capture_output=True)
    p = json.loads(out.read_text())["paths"]
    (name, b), = p["baselines"].items()
    d = b["drafter_minus_this"]
    print(f"along {p['replies']} held-out greedy replies:")
    print("| drafter | acceptance (95% CI) | DSpark minus DFlash (95% paired CI) |")
    print("| --- | --- | --- |")
    ci = lambda r: f"{r['acceptance_length']:.3f} ({r['interval']['lo']:.3f}-{r['interval']['hi']:.3f})"  # noqa: E731
    print(f"| DSpark | {ci(p)} | {d['difference']:+.3f} ({d['lo']:+.3f} to {d['hi']:+.3f}) |")
    print(f"| DFlash | {ci(b)} | |")
    arms = {"DFlash": json.loads((w / "eval_dflash.json").read_text()),
            "DSpark": json.loads((w / "eval.json").read_text())}
    print("\ndecoded on the 48 held-out prompts: acceptance, P(>= k drafts) and P(k | k-1)")
    n = min(len(r["histogram"]) for r in arms.values()) - 1
    print("| drafter | acceptance | " + " | ".join(f"P(>={k})" for k in range(1, n + 1))
          + " | " + " | ".join(f"P({k}\\|{k - 1})" for k in range(2, n + 1)) + " |")
    print("| --- | --- |" + " --- |" * (2 * n - 1))
    for name, r in arms.items():
        at = decoded_per_position(r["histogram"])[:n]
        cond = [at[k] / at[k - 1] if at[k - 1] else float("nan") for k in range(1, n)]
        print(f"| {name} | {r['acceptance_length']:.3f} | " + " | ".join(f"{x:.3f}" for x in at)
              + " | " + " | ".join(f"{x:.2f}" for x in cond) + " |")
    cal = arms["DSpark"].get("calibration")
    if cal:
        rows = [r for r in cal["per_slot"]]
        print(f"\nDSpark confidence calibration ({cal['trials']} trials, ECE {cal['ece']:.3f}):")
        print("| slot k | " + " | ".join(str(r["slot"]) for r in rows) + " |")
        print("| --- |" + " --- |" * len(rows))
        for key in ("trials", "predicted", "observed"):
            print(f"| {key} | " + " | ".join(
                "-" if r[key] is None else (str(r[key]) if key == "trials" else f"{r[key]:.2f}")
                for r in rows) + " |")
    for name, run in (("DFlash", a.dflash), ("DSpark", a.dspark)):
        s = json.loads((run / "summary.json").read_text())
        print(f"{name}: {s['steps']} steps, {s['tokens_per_second']:.0f} real tok/s, loss "
              f"{s['initial_loss']:.2f} -> {s['final_loss']:.2f}, {s['train_seconds']:.0f} s")


if __name__ == "__main__":
    main()
