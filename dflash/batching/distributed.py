"""Sharing an epoch plan between data-parallel ranks.

Every rank rebuilds the same plan from (seed, epoch) and takes its own batches: no
communication, and every rank gets the same number of batches. Batches are dealt in
steps of `world_size` (one per rank); the remainder policy decides what fills the last
step. With synchronous gradients a step lasts as long as its most expensive batch, so
`balance=True` deals each step batches of similar cost (padded tokens plus an attention
term): it removes most straggler time at the price of less length diversity within a
step (never within a batch or across epochs). The report shows the imbalance both ways.
"""
from __future__ import annotations

import numpy as np

from dflash.batching.epoch_plan import EpochPlan
from dflash.errors import ConfigError

# Attention FLOPs per (token x context position) relative to the linear layers' FLOPs per
# token: for an 8B Qwen3 about 4 * d_model * layers / (2 * params) ~ 1 / 27,000.
DEFAULT_ATTENTION_COST = 3.7e-5


def batch_cost(plan: EpochPlan, attention_cost: float = DEFAULT_ATTENTION_COST) -> np.ndarray:
    """Relative compute of each batch: B*S padded tokens plus attention's B*S^2 term."""
    b = plan.batch_rows.astype(np.float64)
    s = plan.seq_len.astype(np.float64)
    return b * s * (1.0 + attention_cost * s)


REMAINDERS = ("repeat", "drop")


def _dealt(num_batches: int, world_size: int, remainder: str) -> np.ndarray:
    """Batch ids in dealing order, a multiple of world_size long."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if remainder == "repeat":
        if num_batches == 0:
            raise ConfigError("the epoch plan has no batches: no sample is left to train on "
                              "(data.overlong=drop with every sample over data.max_seq_len, "
                              "or eval.num_prompts holding out the rest?)")
        extra = (-num_batches) % world_size
        return np.concatenate([np.arange(num_batches), np.arange(extra) % num_batches])
    if remainder == "drop":
        usable = num_batches - num_batches % world_size
        if usable == 0:
            raise ConfigError(f"{num_batches} batches cannot give each of {world_size} "
                              "ranks a batch with batching.remainder=drop")
        return np.arange(usable)
    raise ConfigError(f"batching.remainder must be 'repeat' or 'drop', got {remainder!r}")


def step_groups(plan: EpochPlan, world_size: int, remainder: str = "repeat",
                balance: bool = False, attention_cost: float = DEFAULT_ATTENTION_COST,
                seed: int = 0) -> np.ndarray:
    """[steps, world_size] batch ids: row t holds what each rank runs at step t."""
    order = _dealt(plan.num_batches, world_size, remainder)
    if balance and world_size > 1:
        cost = batch_cost(plan, attention_cost)[order]
        groups = order[np.argsort(cost, kind="stable")].reshape(-1, world_size)
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(plan.epoch), 4099]))
        return groups[rng.permutation(len(groups))]
    return order.reshape(-1, world_size)


def shard(plan: EpochPlan, rank: int, world_size: int, remainder: str = "repeat",
          balance: bool = False, attention_cost: float = DEFAULT_ATTENTION_COST,
          seed: int = 0) -> EpochPlan:
    """This rank's batches, in step order."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    groups = step_groups(plan, world_size, remainder, balance, attention_cost, seed)
    return plan.take(groups[:, rank])


def step_imbalance(plan: EpochPlan, groups: np.ndarray,
                   attention_cost: float = DEFAULT_ATTENTION_COST) -> float:
    """Mean over steps of (slowest rank's cost / mean rank cost): 1.0 is perfect."""
    cost = batch_cost(plan, attention_cost)[groups]
    return float((cost.max(axis=1) / cost.mean(axis=1)).mean())


def remainder_stats(plan: EpochPlan, world_size: int, remainder: str,
                    attention_cost: float = DEFAULT_ATTENTION_COST, balance: bool = False,
                    seed: int = 0) -> dict:
    """What the split does with the remainder, and how even its steps are."""
    nb = plan.num_batches
    sizes = plan.batch_sizes
    if remainder == "repeat":
        extra = (-nb) % world_size
        stats = {"policy": "repeat", "batches_per_rank": -(-nb // world_size),
                 "repeated_batches": int(extra),
                 "repeated_samples": int(sizes[np.arange(extra) % max(nb, 1)].sum()) if nb else 0,
                 "dropped_batches": 0, "dropped_samples": 0}
    else:
        left = nb % world_size
        stats = {"policy": "drop", "batches_per_rank": nb // world_size,
                 "repeated_batches": 0, "repeated_samples": 0, "dropped_batches": int(left),
                 "dropped_samples": int(sizes[nb - left:].sum()) if left else 0}
    imb = {mode: step_imbalance(plan, step_groups(plan, world_size, remainder, mode,
                                                  attention_cost, seed), attention_cost)
           for mode in (False, True)}
    return {"world_size": world_size, **stats, "balance_steps": bool(balance),
            "step_imbalance": imb[bool(balance)], "step_imbalance_unbalanced": imb[False],
            "step_imbalance_balanced": imb[True]}
