"""`python -m dflash.plan`: plan epochs for a set of sample lengths and report on them.

    python -m dflash.plan lengths_file=F.npy batching=bucketed buckets=seed6 epochs=2 \
        seed=0 report=R.json dump=DIR
    python -m dflash.plan --multirun experiment=compare_batching report=cmp.json \
        batching=sorted,random,bucketed,megabatch

`report` holds a JSON list with one object per strategy run; a run replaces the entry
of an earlier run with the same settings, so a multirun fills in one file. `plot=P.png`
draws every run in that file on the efficiency / length-mixing plane.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from dflash import config
from dflash.batching.packed_rows import anchor_slots_per_row
from dflash.batching.report import format_report, plan_report
from dflash.batching.step_cost import load_cost_file, predict_steps
from dflash.batching.strategies import planner_for
from dflash.options import choice
from dflash.data.build import Data, load_data
from dflash.warmup.profile import model_identity
from dflash.warmup.shapes import build_shape_plan, format_shape_report
from dflash.errors import check_file_path, hydra_dirs_checked, user_errors_exit

config.register()  # the schemas every app composes against

log = logging.getLogger("dflash.plan")

_IDENTITY = ("strategy", "boundaries", "bucket_caps", "token_budget", "max_batch_size",
             "sort_window", "seed", "epochs", "num_samples", "settings")


def run_settings(cfg: DictConfig) -> dict:
    """Everything that decides a plan: two runs replace each other in a report only when
    all of it agrees (topology, remainder, balancing, data source and path included)."""
    b, d = cfg.batching, cfg.data
    return {"dp_size": int(cfg.topology.dp_size), "remainder": choice(b.remainder),
            "balance_steps": bool(b.balance_steps), "attention_cost": float(b.attention_cost),
            "data_source": choice(d.source), "data_path": d.path, "lengths_file": cfg.lengths_file,
            "data_seed": int(d.seed), "length_scale": float(d.length_scale),
            "max_seq_len": int(d.max_seq_len), "overlong": choice(d.overlong),
            "row_len": int(b.row_len), "pack_window": int(b.pack_window)}


def report_for(cfg: DictConfig, data: Data, dump_dir=None, cost=None) -> dict:
    """Plan `cfg.epochs` epochs of `data` with the config's batching, buckets, topology;
    `cost`: the loaded `cfg.cost` file (read here when not given)."""
    _, planner = planner_for(cfg, data.lengths)
    report = plan_report(planner, int(cfg.epochs), world_size=int(cfg.topology.dp_size),
                         remainder=choice(cfg.batching.remainder), dump_dir=dump_dir, progress=True,
                         balance=bool(cfg.batching.balance_steps),
                         attention_cost=float(cfg.batching.attention_cost),
                         original_ids=data.original_ids)
    report["buckets_preset"] = cfg.buckets.name
    report["data"] = data.info
    report["settings"] = run_settings(cfg)
    anchors = int(cfg.anchors if cfg.anchors is not None else cfg.model.drafter.num_anchors)
    if planner.packs_rows:
        anchors = report["anchors_per_row"] = anchor_slots_per_row(
            data.lengths, anchors, planner.spec.row_len, int(cfg.batching.anchors_per_row))
    # the closed shape set training would warm for these plans (`warmup=...`)
    plans = [planner.epoch(e) for e in range(int(cfg.epochs))]
    shape_plan = build_shape_plan(plans, cfg.warmup, anchors)
    report["warmup"] = shape_plan.report()
    if cfg.cost:
        report["cost"] = predicted_cost(cfg, shape_plan, plans, cost or cost_file(cfg))
    return report


def cost_file(cfg: DictConfig):
    """`cost=FILE`: (model, file) checked against this run's model sizes (the hardware is
    the file's: plans are often made away from the GPUs)."""
    return load_cost_file(cfg.cost, model_identity(cfg))


def predicted_cost(cfg: DictConfig, shape_plan, plans, cost) -> dict:
    """Per epoch: the step cost model's time for every batch at the shape it runs at,
    summed, and the real tokens per second that gives; `cost`: cost_file's (model, file)."""
    model, doc = cost
    epochs = []
    for plan in plans:
        pred = predict_steps(model, *shape_plan.run_arrays(plan.epoch))
        tokens = int(plan.num_tokens.sum())
        epochs.append({"epoch": plan.epoch, "steps": plan.num_batches,
                       "predicted_seconds": pred["total_seconds"],
                       "real_tokens_per_second": tokens / max(pred["total_seconds"], 1e-12),
                       "extrapolated_steps": pred["extrapolated_steps"]})
    secs = sum(e["predicted_seconds"] for e in epochs)
    return {"file": str(cfg.cost), "device": doc["identity"].get("device"),
            "fit": doc.get("fit", {}), "epochs": epochs,
            "predicted_seconds_per_epoch": secs / max(1, len(epochs)),
            "real_tokens_per_second": sum(int(p.num_tokens.sum()) for p in plans) / max(secs, 1e-12),
            "extrapolated_steps": sum(e["extrapolated_steps"] for e in epochs)}


def format_cost(c: dict) -> str:
    held = c["fit"].get("heldout_mean_abs_error")
    lines = [f"predicted on {c['device']} ({c['file']}"
             + (f", held-out error {100 * held:.1f}%" if held is not None else "") + "): "
             f"{c['predicted_seconds_per_epoch']:.1f} s per epoch, "
             f"{c['real_tokens_per_second']:,.0f} real tokens/s"]
    if c["extrapolated_steps"]:
        lines.append(f"WARNING: {c['extrapolated_steps']} steps run at shapes outside the "
                     "profiled range: their time is extrapolated (profile with this plan)")
    return "\n".join(lines)


def run_plan(cfg: DictConfig) -> dict:
    check_file_path("report", cfg.report)
    check_file_path("plot", cfg.plot)
    cost = cost_file(cfg) if cfg.cost else None  # refused before the data loads
    report = report_for(cfg, load_data(cfg.data, lengths_file=cfg.lengths_file), cfg.dump, cost)
    entries = write_report(Path(cfg.report), report) if cfg.report else [report]
    if cfg.plot:
        from dflash.batching.plan_plot import plot_tradeoff
        plot_tradeoff(entries, cfg.plot)
    return report


def write_report(path: Path, report: dict) -> list[dict]:
    entries = []
    if path.exists():
        try:
            old = json.loads(path.read_text())
            entries = old if isinstance(old, list) else [old]
        except json.JSONDecodeError:
            log.warning("report %s was not valid JSON; starting it afresh", path)
    same = lambda e: all(e.get(k) == report.get(k) for k in _IDENTITY)  # noqa: E731
    entries = [e for e in entries if not same(e)] + [report]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries, indent=2))
    return entries


@hydra_dirs_checked
@hydra.main(config_path="conf", config_name="plan", version_base="1.3")
@user_errors_exit
def main(cfg: DictConfig) -> None:
    report = run_plan(cfg)
    print(format_report(report))
    print(format_shape_report(report["warmup"]))
    if report.get("cost"):
        print(format_cost(report["cost"]))
    for name in ("report", "plot"):
        if cfg[name]:
            print(f"{name}: {cfg[name]}")


if __name__ == "__main__":
    main()
