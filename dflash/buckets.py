"""`python -m dflash.buckets`: fit optimal bucket boundaries and write a preset.

    python -m dflash.buckets lengths_file=F.npy num_buckets=6 out=conf/buckets/mine.yaml
    python -m dflash.buckets data=tokenized data.path=DIR num_buckets=auto out=P.yaml plot=P.png

The objective is the padding efficiency of dflash's bucketed shuffle as it really packs
(random order inside a bucket, greedy rule, batching.token_budget and max_batch_size).
A dynamic program finds the optimum of an analytic model of it; `refine=true` (default)
then polishes that answer against the exact simulation of the planner (which also sees
batching.sort_window), on a finer grid. The simulated figure is the one reported and
written into the preset; the model's figure is shown beside it. A preset written under
conf/buckets/ is then selected with `buckets=<name>`.
"""
from __future__ import annotations

import logging
from pathlib import Path

import hydra
import numpy as np
import yaml
from omegaconf import DictConfig

from dflash import config
from dflash.batching.bucket_fit.optimal import (build_cost_table, choose_auto, optimal_fits, predict,
                                                simulate, simulate_seconds)
from dflash.batching.bucket_fit.caps import fit_bucket_caps
from dflash.batching.step_cost import load_cost_file
from dflash.batching.bucket_fit.refine import refine_by_simulation
from dflash.errors import DataError, check_file_path, hydra_dirs_checked, user_errors_exit
from dflash.batching.metrics import format_table
from dflash.batching.strategies import PackingSpec
from dflash.data.build import load_data

config.register()  # the schemas every app composes against

log = logging.getLogger("dflash.buckets")


def parse_k(value) -> int | str:
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    try:
        k = int(text)
    except ValueError:
        raise DataError(f"num_buckets must be an integer or 'auto', got {value!r}") from None
    if k < 1:
        raise DataError(f"num_buckets must be >= 1, got {k}")
    return k


def run_buckets(cfg: DictConfig) -> dict:
    k = parse_k(cfg.num_buckets)
    check_file_path("out", cfg.out)
    check_file_path("plot", cfg.plot)
    cost = load_cost_file(cfg.cost) if cfg.cost else None  # refused before the data loads
    data = load_data(cfg.data, lengths_file=cfg.lengths_file)
    lengths = data.lengths
    spec = PackingSpec.from_cfg(cfg.batching)
    q = float(cfg.quadratic)
    table = build_cost_table(lengths, spec, int(cfg.candidates), q, progress=True)
    k_max = min(int(cfg.auto_max), table.num_bins) if k == "auto" else k
    fits = optimal_fits(table, k_max)
    fit = choose_auto(fits, float(cfg.auto_gap)) if k == "auto" else fits[-1]
    boundaries, dp_sim = fit.boundaries, None
    if cfg.refine and fit.num_buckets > 1:
        dp_sim = simulate(lengths, boundaries, spec, 1, int(cfg.seed), q)["efficiency"]
        boundaries, _, _ = refine_by_simulation(
            lengths, boundaries, spec, q, grid_bins=4 * int(cfg.candidates),
            max_passes=int(cfg.refine_passes), seed=int(cfg.seed), progress=True)
    predicted, per_bucket = predict(lengths, boundaries, spec, q)
    sim = simulate(lengths, boundaries, spec, epochs=2, seed=int(cfg.seed), quadratic=q)
    rows = [{**r, "predicted": p} for r, p in zip(sim["buckets"], per_bucket)]
    # the top bucket holds every length the data config allows, not just this data's
    # longest sample (the next data set may be longer); the plan is unchanged by it
    boundaries = boundaries.copy()
    boundaries[-1] = max(int(boundaries[-1]), int(cfg.data.max_seq_len) + 1)
    rows[-1]["hi"] = int(boundaries[-1])
    result = {
        "boundaries": boundaries.tolist(), "num_buckets": fit.num_buckets,
        "predicted_efficiency": predicted, "dp_simulated_efficiency": dp_sim,
        "simulated_efficiency": sim["efficiency"], "buckets": rows,
        "curve": [{"num_buckets": f.num_buckets, "predicted_efficiency": f.predicted_efficiency}
                  for f in fits],
        "token_budget": spec.token_budget, "max_batch_size": spec.max_batch_size,
        "sort_window": spec.sort_window, "quadratic": q, "num_samples": int(len(lengths)),
        "max_seq_len": int(cfg.data.max_seq_len),
        "fitted_on": data.info.get("path", data.info.get("source")),
        "auto": k == "auto",
    }
    if cfg.cost:
        result["time_fit"] = fit_to_time(cfg, lengths, spec, k, result, cost)
        result["padding_boundaries"] = result["boundaries"]
        result["boundaries"] = result["time_fit"]["boundaries"]
        result["num_buckets"] = result["time_fit"]["num_buckets"]
        result["simulated_efficiency"] = result["time_fit"]["simulated_efficiency"]
        result["bucket_caps"] = result["time_fit"]["bucket_caps"]
    if cfg.out:
        write_preset(Path(cfg.out), result, cfg.name)
    if cfg.plot:
        from dflash.batching.bucket_fit.plot import plot_fit
        plot_fit(lengths, boundaries, per_bucket, [r["efficiency"] for r in rows], cfg.plot,
                 title=f"{fit.num_buckets} buckets: simulated {sim['efficiency']:.4f} "
                       f"(model {predicted:.4f})")
    return result


def fit_to_time(cfg: DictConfig, lengths, spec: PackingSpec, k, padding: dict, cost) -> dict:
    """Boundaries minimising the predicted epoch time under a step cost model (the same
    DP over the same chain, each batch costing its step's predicted seconds), measured
    against the padding-optimal ones by exact simulation of the planner; `cost`: the
    loaded cost file (model, file)."""
    model, doc = cost
    anchors = int(cfg.anchors if cfg.anchors is not None else model.bounds.get("anchors", 1))
    pad = int(cfg.pad_to_multiple)
    table = build_cost_table(lengths, spec, int(cfg.candidates), time_model=model,
                             anchors=anchors, progress=True)
    k_max = min(int(cfg.auto_max), table.num_bins) if k == "auto" else k
    fits = optimal_fits(table, k_max)
    sims = [simulate_seconds(lengths, f.boundaries, spec, model, anchors, 1, int(cfg.seed), pad)
            for f in fits]
    if k == "auto":  # the fastest fit within the shape budget
        ok = [i for i, s in enumerate(sims)
              if cfg.max_shapes is None or s["distinct_shapes"] <= int(cfg.max_shapes)]
        if not ok:
            raise DataError(f"max_shapes={cfg.max_shapes}: even one bucket runs at "
                            f"{sims[0]['distinct_shapes']} distinct shapes; raise it or round "
                            "lengths coarser (pad_to_multiple)")
        best = min(ok, key=lambda i: sims[i]["seconds_per_epoch"])
    else:
        best = len(fits) - 1
    fit, sim = fits[best], sims[best]
    caps = fit_caps(cfg, lengths, fit.boundaries, spec, model, anchors) if cfg.fit_caps else None
    bucket_caps = None
    if caps and caps["adopted"]:
        bucket_caps, sim = np.asarray(caps["caps"]), caps["with_caps"]
    boundaries = fit.boundaries.copy()
    boundaries[-1] = max(int(boundaries[-1]), int(cfg.data.max_seq_len) + 1)
    padding_bounds = np.asarray(padding["boundaries"], dtype=np.int64)
    return {"boundaries": boundaries.tolist(), "num_buckets": fit.num_buckets, **sim,
            "bucket_caps": None if bucket_caps is None else bucket_caps.tolist(), "caps": caps,
            "simulated_efficiency": simulate(lengths, fit.boundaries, spec, 2, int(cfg.seed),
                                             bucket_caps=bucket_caps)["efficiency"],
            "padding_fit": simulate_seconds(lengths, padding_bounds, spec, model, anchors, 1,
                                            int(cfg.seed), pad),
            "anchors": anchors, "device": doc["identity"].get("device"), "cost": str(cfg.cost)}


def fit_caps(cfg: DictConfig, lengths, boundaries, spec: PackingSpec, model, anchors: int):
    """A batch size cap per bucket under the cost model (bucket_fit/caps.py), priced
    against the caps-free plan by exact simulation (2 epochs, the same seed): adopted
    only when faster there too and within `max_shapes`. None when no bucket gains."""
    caps, rows = fit_bucket_caps(lengths, boundaries, spec, model, anchors)
    if not (caps < spec.max_batch_size).any():
        return None
    run = lambda c: simulate_seconds(lengths, boundaries, spec, model, anchors, 2,  # noqa: E731
                                     int(cfg.seed), int(cfg.pad_to_multiple), bucket_caps=c)
    without, with_caps = run(None), run(caps)
    within = cfg.max_shapes is None or with_caps["distinct_shapes"] <= int(cfg.max_shapes)
    adopted = within and with_caps["seconds_per_epoch"] < without["seconds_per_epoch"]
    return {"caps": caps.tolist(), "per_bucket": rows, "adopted": bool(adopted),
            "with_caps": with_caps, "without_caps": without,
            "why": "faster by exact simulation" if adopted else
                   ("over max_shapes" if not within else "not faster by exact simulation")}


def format_time_fit(t: dict) -> str:
    p = t["padding_fit"]
    return "\n".join([
        f"fitted to time with {t['cost']} ({t['device']}, {t['anchors']} anchor slots):",
        f"{'fit':>8} {'buckets':>8} {'s/epoch':>9} {'real tok/s':>11} {'shapes':>7}",
        f"{'time':>8} {t['num_buckets']:>8} {t['seconds_per_epoch']:>9.2f} "
        f"{t['real_tokens_per_second']:>11,.0f} {t['distinct_shapes']:>7}",
        f"{'padding':>8} {'':>8} {p['seconds_per_epoch']:>9.2f} "
        f"{p['real_tokens_per_second']:>11,.0f} {p['distinct_shapes']:>7}",
        format_caps(t.get("caps"))])


def format_caps(caps: dict | None) -> str:
    if caps is None:
        return "per-bucket batch sizes: none predicted faster than batching.max_batch_size"
    w, wo = caps["with_caps"], caps["without_caps"]
    verdict = "written to the preset" if caps["adopted"] else f"not used ({caps['why']})"
    return (f"per-bucket batch sizes {caps['caps']}: {w['seconds_per_epoch']:.2f} s/epoch, "
            f"{w['distinct_shapes']} shapes, against {wo['seconds_per_epoch']:.2f} s and "
            f"{wo['distinct_shapes']} shapes with one cap; {verdict}")


def write_preset(path: Path, result: dict, name: str | None) -> None:
    preset = {
        "name": name or path.stem,
        "kind": "fixed",
        "boundaries": result["boundaries"],
        "num_buckets": result["num_buckets"],
        **({"max_batch_size": result["bucket_caps"]} if result.get("bucket_caps") else {}),
        "meta": {k: result[k] for k in ("simulated_efficiency", "predicted_efficiency",
                                        "token_budget", "max_batch_size", "sort_window",
                                        "quadratic", "num_samples", "max_seq_len",
                                        "fitted_on")},
    }
    header = (f"# Fitted by `python -m dflash.buckets` on {result['fitted_on']} "
              f"({result['num_samples']:,} samples), budget {result['token_budget']}, "
              f"cap {result['max_batch_size']}, sort_window {result['sort_window']}.\n"
              f"# Padding efficiency of the bucketed shuffle, exact simulation of the planner: "
              f"{result['simulated_efficiency']:.4f}.\n"
              f"# The top bucket ends at data.max_seq_len + 1 = {result['boundaries'][-1]}: "
              "it holds every length that data config allows.\n")
    if result.get("bucket_caps"):
        header += (f"# max_batch_size: a cap per bucket, fitted to {result['time_fit']['cost']} "
                   "(predicted faster than one cap for all; batching=bucketed only).\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(preset, sort_keys=False))


def format_result(result: dict) -> str:
    lines = [f"boundaries: {result['boundaries']}",
             f"num_buckets={result['num_buckets']}  model_efficiency="
             f"{result['predicted_efficiency']:.4f}  simulated_efficiency="
             f"{result['simulated_efficiency']:.4f}",
             format_table(result["buckets"], ["lo", "hi", "samples", "batches",
                                              "mean_batch_size", "predicted", "efficiency"],
                          title="per bucket (efficiency: exact simulation; predicted: the "
                                "analytic model, random order, no sort_window; both "
                                "cost-weighted when quadratic > 0)")]
    if result["auto"]:
        lines.append(format_table(result["curve"], ["num_buckets", "predicted_efficiency"],
                                  title="optimal efficiency by number of buckets"))
    return "\n".join(lines)


@hydra_dirs_checked
@hydra.main(config_path="conf", config_name="bucket_fit", version_base="1.3")
@user_errors_exit
def main(cfg: DictConfig) -> None:
    result = run_buckets(cfg)
    print(format_result(result))
    if result.get("time_fit"):
        print(format_time_fit(result["time_fit"]))
    if cfg.out:
        print(f"preset: {cfg.out}")
    if cfg.plot:
        print(f"plot: {cfg.plot}")


if __name__ == "__main__":
    main()
