"""`python -m dflash.buckets`: fit optimal bucket boundaries and write a preset.

    python -m dflash.buckets lengths_file=F.npy num_buckets=6 out=conf/buckets/mine.yaml
    python -m dflash.buckets data=tokenized data.path=DIR num_buckets=auto out=P.yaml plot=P.png

The objective is the padding efficiency of dflash's bucketed shuffle as it really packs
(random order inside a bucket, greedy rule, batching.token_budget and max_batch_size).
The fit is verified by exact simulation of the planner; both numbers are reported. A
preset written under conf/buckets/ is then selected with `buckets=<name>`.
"""
from __future__ import annotations

import logging
from pathlib import Path

import hydra
import yaml
from omegaconf import DictConfig

from . import config as _config  # noqa: F401  (registers the schemas)
from .batching.bucket_opt import build_cost_table, choose_auto, optimal_fits, simulate
from .errors import DataError, user_errors_exit
from .batching.metrics import format_table
from .batching.strategies import PackingSpec
from .data.build import load_data

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
    data = load_data(cfg.data, lengths_file=cfg.lengths_file)
    lengths = data.lengths
    spec = PackingSpec.from_cfg(cfg.batching)
    table = build_cost_table(lengths, spec, int(cfg.candidates), float(cfg.quadratic),
                             progress=True)
    k_max = min(int(cfg.auto_max), table.num_bins) if k == "auto" else k
    fits = optimal_fits(table, k_max)
    fit = choose_auto(fits, float(cfg.auto_gap)) if k == "auto" else fits[-1]
    sim = simulate(lengths, fit.boundaries, spec, epochs=2, seed=int(cfg.seed),
                   quadratic=float(cfg.quadratic))
    rows = [{**r, "predicted": p} for r, p in zip(sim["buckets"], fit.per_bucket_predicted)]
    result = {
        "boundaries": fit.boundaries.tolist(), "num_buckets": fit.num_buckets,
        "predicted_efficiency": fit.predicted_efficiency,
        "simulated_efficiency": sim["efficiency"], "buckets": rows,
        "curve": [{"num_buckets": f.num_buckets, "predicted_efficiency": f.predicted_efficiency}
                  for f in fits],
        "token_budget": spec.token_budget, "max_batch_size": spec.max_batch_size,
        "quadratic": float(cfg.quadratic), "num_samples": int(len(lengths)),
        "fitted_on": data.info.get("path", data.info.get("source")),
        "auto": k == "auto",
    }
    if cfg.out:
        write_preset(Path(cfg.out), result, cfg.name)
    if cfg.plot:
        from .batching.bucket_plot import plot_fit
        plot_fit(lengths, fit.boundaries, fit.per_bucket_predicted,
                 [r["efficiency"] for r in rows], cfg.plot,
                 title=f"{fit.num_buckets} buckets: predicted {fit.predicted_efficiency:.4f}, "
                       f"simulated {sim['efficiency']:.4f}")
    return result


def write_preset(path: Path, result: dict, name: str | None) -> None:
    preset = {
        "name": name or path.stem,
        "kind": "fixed",
        "boundaries": result["boundaries"],
        "num_buckets": result["num_buckets"],
        "meta": {k: result[k] for k in ("predicted_efficiency", "simulated_efficiency",
                                        "token_budget", "max_batch_size", "quadratic",
                                        "num_samples", "fitted_on")},
    }
    header = (f"# Fitted by `python -m dflash.buckets` on {result['fitted_on']} "
              f"({result['num_samples']:,} samples), budget {result['token_budget']}, "
              f"cap {result['max_batch_size']}.\n# Efficiency of the bucketed shuffle: "
              f"predicted {result['predicted_efficiency']:.4f}, "
              f"exact simulation {result['simulated_efficiency']:.4f}.\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(preset, sort_keys=False))


def format_result(result: dict) -> str:
    lines = [f"boundaries: {result['boundaries']}",
             f"num_buckets={result['num_buckets']}  predicted_efficiency="
             f"{result['predicted_efficiency']:.4f}  simulated_efficiency="
             f"{result['simulated_efficiency']:.4f}",
             format_table(result["buckets"], ["lo", "hi", "samples", "batches",
                                              "mean_batch_size", "predicted", "efficiency"],
                          title="per bucket (efficiency = exact simulation)")]
    if result["auto"]:
        lines.append(format_table(result["curve"], ["num_buckets", "predicted_efficiency"],
                                  title="optimal efficiency by number of buckets"))
    return "\n".join(lines)


@hydra.main(config_path="../conf", config_name="buckets", version_base="1.3")
@user_errors_exit
def main(cfg: DictConfig) -> None:
    result = run_buckets(cfg)
    print(format_result(result))
    if cfg.out:
        print(f"preset: {cfg.out}")
    if cfg.plot:
        print(f"plot: {cfg.plot}")


if __name__ == "__main__":
    main()
