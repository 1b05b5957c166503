"""`python -m dflash.profile [train overrides] out=cost.json`: measure the step's cost.

Builds the run a training job with the same overrides would (data, plans, target,
drafter, optimizer, devices, dtypes), times the whole step at the shapes that run will
meet (`dflash.warmup.profile`), fits the step cost model (`dflash.batching.step_cost`)
and writes the cost file: hardware and model identity, the measured points, the fitted
coefficients and their error on held-out points. `python -m dflash.plan ... cost=FILE`,
`python -m dflash.buckets ... cost=FILE` and training (`cost=FILE`) then predict with it.
"""
from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from dflash import config
from dflash.batching.step_cost import TERMS, fit_with_holdout, repeat_spread, write_cost_file
from dflash.errors import check_file_path, hydra_dirs_checked, user_errors_exit
from dflash.trainer import Trainer
from dflash.warmup.profile import profile_shapes, run_identity, time_shapes
from dflash.warmup.shapes import Shape

config.register()

log = logging.getLogger("dflash.profile")
# a repeat spread above this is more than the error a prediction is meant to meet (10%)
UNSTEADY = 0.10


def run_profile(cfg: DictConfig, out_dir) -> dict:
    p = cfg.profile
    check_file_path("profile.out", p.out)  # written after minutes of timing
    trainer = Trainer(cfg, out_dir).build()
    warm = list(trainer.shapes.warm)
    if not warm:  # warmup=none: the distinct shapes the run meets
        rows, lens, anchors = trainer.shapes.run_arrays()
        warm = sorted({Shape(int(r), int(s), int(a)) for r, s, a in zip(rows, lens, anchors)},
                      key=lambda s: s.tokens)
    b = cfg.batching
    shapes = profile_shapes(warm, int(b.token_budget), int(b.max_batch_size), int(p.max_shapes),
                            int(p.grid))
    packed = trainer.planner.packs_rows
    # packed rows hold documents of the data's mean length (the warm run's one document
    # per row is the most work, not the typical)
    doc_len = int(round(float(trainer.sources.data.lengths.mean()))) if packed else 0
    points = time_shapes(trainer.train_step, shapes, int(trainer.target.vocab_size),
                         trainer.topo.drafter_device, reps=int(p.reps), packed=packed,
                         progress=bool(cfg.logger.progress), doc_len=doc_len)
    model, fit = fit_with_holdout(points, int(p.holdout_every))
    if int(p.reps) >= 2:  # one repeat has no spread
        fit["repeat_spread"] = repeat_spread(points)
    if int(p.calibrate_steps) > 0:
        fit["calibration"] = calibrate(cfg, model, Path(out_dir) / "calibrate", int(p.calibrate_steps))
    identity = run_identity(cfg, trainer.topo.drafter_device)
    path = write_cost_file(p.out, identity, model, points, fit)
    return {"path": str(path), "identity": identity, "model": model.as_dict(), "fit": fit,
            "num_points": len(points)}


def calibrate(cfg: DictConfig, model, out_dir: Path, steps: int) -> dict:
    """What the training loop adds to the bare step (collating real batches, metrics,
    bookkeeping): train `steps` real steps of this run, compare with the model's price
    for the shapes they ran at, and fold the difference per step into the step term."""
    from dflash.loggers import Logger
    short = OmegaConf.merge(cfg, {"optim": {"max_steps": steps}, "eval": {"enabled": False},
                                  "cost": None, "logger": {"progress": False}})
    t = Trainer(short, out_dir).build()
    s = t.train(Logger())
    shapes = [t.shapes.for_batch(b) for e in range(t.num_epochs)
              for b in t.shard(e).batches()][:s["steps"]]
    predicted = float(model.run_seconds([x.batch_size for x in shapes], [x.seq_len for x in shapes],
                                        [x.anchors for x in shapes]).sum())
    per_step = (s["train_seconds"] - predicted) / max(1, s["steps"])
    model.coef[0] = max(0.0, model.coef[0] + per_step)
    return {"steps": s["steps"], "measured_seconds": s["train_seconds"],
            "predicted_seconds": predicted, "loop_seconds_per_step": per_step}


def format_profile(r: dict) -> str:
    f = r["fit"]
    lines = [f"cost file: {r['path']} ({r['num_points']} shapes on {r['identity']['device']})",
             "seconds = " + " + ".join(f"{c:.3g}*{t}" for t, c in zip(TERMS, r["model"]["coef"])),
             f"fit error: mean {100 * f['fit_mean_abs_error']:.1f}%"]
    if "heldout_mean_abs_error" in f:
        lines[-1] += (f"; on {f['num_heldout']} held-out shapes mean "
                      f"{100 * f['heldout_mean_abs_error']:.1f}%, max "
                      f"{100 * f['heldout_max_abs_error']:.1f}%")
    spread = f.get("repeat_spread")
    if spread is not None:
        lines.append(f"repeats of one shape: median spread {100 * spread:.1f}% (slowest - fastest)")
    if "calibration" in f:
        c = f["calibration"]
        lines.append(f"training loop: {c['steps']} real steps took {c['measured_seconds']:.2f} s, "
                     f"the bare step {c['predicted_seconds']:.2f} s: "
                     f"{1e3 * c['loop_seconds_per_step']:+.1f} ms per step added to the step term")
    return "\n".join(lines)


def steadiness_warning(fit: dict) -> str | None:
    """One line when the machine repeats a shape less closely than a prediction is
    meant to hold: every figure predicted from this file inherits that noise."""
    spread = fit.get("repeat_spread")
    if spread is None or spread <= UNSTEADY:
        return None
    return (f"this machine's step time moved {100 * spread:.0f}% between repeats of one shape "
            f"(median over shapes): no prediction from this file can be closer than that. On a "
            f"shared CPU fewer threads are often steadier (OMP_NUM_THREADS=1; the cost file "
            f"records the count, so training must use the same)")


@hydra_dirs_checked
@hydra.main(config_path="conf", config_name="profile", version_base="1.3")
@user_errors_exit
def main(cfg: DictConfig) -> None:
    out = Path(HydraConfig.get().runtime.output_dir)
    r = run_profile(cfg, out)
    print(format_profile(r))
    warning = steadiness_warning(r["fit"])
    if warning:
        log.warning(warning)


if __name__ == "__main__":
    main()
