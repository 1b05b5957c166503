"""The plan report: the JSON object `dflash.plan` writes and `dflash.train` prints."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from dflash.batching.metrics import bucket_table, format_table, length_mixing, pair_repeat_rate
from dflash.batching.distributed import remainder_stats
from dflash.batching.strategies import Planner


def plan_report(planner: Planner, epochs: int, world_size: int = 1, remainder: str = "repeat",
                dump_dir=None, progress: bool = False, balance: bool = False,
                attention_cost: float | None = None, original_ids=None) -> dict:
    """Plans `epochs` epochs (at least two, for pair_repeat_rate) and measures them.

    Top-level token and batch counts are those of epoch 0; `per_epoch` lists each epoch.
    """
    n_plan = max(2, epochs)
    plans, seconds = [], []
    for e in tqdm(range(n_plan), desc=f"plan {planner.strategy}", disable=not progress):
        t0 = time.perf_counter()
        plans.append(planner.epoch(e))
        seconds.append(time.perf_counter() - t0)
        if dump_dir is not None and e < epochs:
            Path(dump_dir).mkdir(parents=True, exist_ok=True)
            plans[-1].save_npz(Path(dump_dir) / f"epoch{e}.npz", original_ids)
    first = plans[0]
    lengths = planner.lengths
    repeats = [pair_repeat_rate(plans[e], plans[e + 1], planner.num_samples)
               for e in range(n_plan - 1)]
    mixing = [length_mixing(p, lengths) for p in plans[:epochs or 1]]
    spec = planner.spec
    return {
        "strategy": planner.strategy,
        "num_samples": planner.num_samples,
        "useful_tokens": first.useful_tokens,
        "padded_tokens": first.padded_tokens,
        "padding_efficiency": first.padding_efficiency,
        "num_batches": first.num_batches,
        "pair_repeat_rate": float(np.mean(repeats)),
        "length_mixing": float(np.mean(mixing)),
        "plan_seconds": float(np.mean(seconds)),
        "buckets": bucket_table(first, planner.boundaries),
        "boundaries": planner.boundaries.tolist(),
        "token_budget": spec.token_budget,
        "max_batch_size": spec.max_batch_size,
        **({"bucket_caps": planner.bucket_caps.tolist()}
           if planner.bucket_caps is not None and planner.traits.uses_buckets else {}),
        "sort_window": spec.sort_window,
        **({"row_len": spec.row_len, "rows_per_batch": planner.rows_per_batch,
            "pack_window": spec.pack_window} if planner.packs_rows else {}),
        "seed": planner.seed,
        "epochs": epochs,
        "per_epoch": [{"epoch": p.epoch, "num_batches": p.num_batches,
                       "padded_tokens": p.padded_tokens,
                       "padding_efficiency": p.padding_efficiency} for p in plans[:max(epochs, 1)]],
        "distributed": remainder_stats(first, world_size, remainder, balance=balance,
                                       seed=planner.seed, **({} if attention_cost is None else
                                                            {"attention_cost": attention_cost})),
    }


def format_report(report: dict) -> str:
    head = (f"strategy={report['strategy']}  samples={report['num_samples']:,}  "
            f"batches={report['num_batches']:,}  budget={report['token_budget']:,}  "
            f"cap={report.get('bucket_caps', report['max_batch_size'])}\n"
            f"padding_efficiency={report['padding_efficiency']:.4f}  "
            f"length_mixing={report['length_mixing']:.4f}  "
            f"pair_repeat_rate={report['pair_repeat_rate']:.4f}  "
            f"plan_seconds={report['plan_seconds']:.3f}\n"
            f"useful_tokens={report['useful_tokens']:,}  padded_tokens={report['padded_tokens']:,}")
    d = report["distributed"]
    dist = (f"distributed: {d['world_size']} rank(s), {d['batches_per_rank']:,} batches each, "
            f"remainder={d['policy']} (repeated {d['repeated_batches']} batches / "
            f"{d['repeated_samples']} samples, dropped {d['dropped_batches']} batches / "
            f"{d['dropped_samples']} samples); step imbalance (slowest/mean rank) "
            f"{d['step_imbalance']:.3f} with balance_steps={d['balance_steps']} "
            f"[unbalanced {d['step_imbalance_unbalanced']:.3f}, balanced "
            f"{d['step_imbalance_balanced']:.3f}]")
    table = format_table(report["buckets"], ["lo", "hi", "samples", "batches",
                                             "mean_batch_size", "efficiency"],
                         title="per bucket (a batch belongs to the bucket of its longest sample)")
    return "\n".join([head, dist, table])


def plan_quality(planner: Planner) -> dict:
    """Diversity of a run's plans: pair repeat rate (epoch 0 -> 1) and length mixing."""
    e0, e1 = planner.epoch(0), planner.epoch(1)
    return {"pair_repeat_rate": pair_repeat_rate(e0, e1, planner.num_samples),
            "length_mixing": length_mixing(e0, planner.lengths),
            "plan_padding_efficiency": e0.padding_efficiency}


def plan_info(planner: Planner, boundaries, length, shapes: dict) -> dict:
    """What a training run's logger shows once: the per-bucket table, lengths and
    boundaries, plan quality, the run's length (`length`: a RunLength) and its shapes."""
    return {"buckets": bucket_table(planner.epoch(0), boundaries),
            "boundaries": boundaries.tolist(), "lengths": planner.lengths,
            **plan_quality(planner), "steps_per_epoch": length.steps_per_epoch,
            "total_steps": length.total_steps, "shapes": shapes}
