"""Ranks plan independently (no communication) and still agree: real gloo processes."""

import numpy as np
import pytest

from hypothesis import given, settings, strategies as st

from dflash.batching import PackingSpec, Planner, STRATEGIES
from dflash.batching.boundaries import preset_boundaries
from dflash.batching.distributed import shard, step_groups, step_imbalance


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=30, deadline=None)
@given(world=st.integers(1, 9), remainder=st.sampled_from(["repeat", "drop"]),
       balance=st.booleans(), seed=st.integers(0, 1000),
       lengths=st.lists(st.integers(1, 2000), min_size=1, max_size=300))
def test_every_rank_gets_the_same_number_of_batches(strategy, world, remainder, balance, seed,
                                                     lengths):
    lengths = np.array(lengths)
    spec = PackingSpec(4000, 12, row_len=2000)  # row_len: packed only (2 rows a batch)
    plan = Planner(strategy, lengths, [0, 700, 2001], spec, seed=seed).epoch(1)
    if remainder == "drop" and len(plan) < world:
        with pytest.raises(ValueError, match="cannot give each"):
            shard(plan, 0, world, remainder)
        return
    shards = [shard(plan, r, world, remainder, balance, seed=seed) for r in range(world)]
    assert len({len(s) for s in shards}) == 1
    seen = np.concatenate([s.indices for s in shards])
    if remainder == "repeat":
        assert set(seen.tolist()) == set(range(len(lengths)))  # nobody dropped
    else:
        kept = len(plan) - len(plan) % world
        assert len(seen) == plan.offsets[kept] and len(set(seen.tolist())) == len(seen)
    # shards are deterministic: a second call deals the same batches
    again = shard(plan, world - 1, world, remainder, balance, seed=seed)
    assert np.array_equal(again.indices, shards[-1].indices)


def test_balanced_steps_cut_straggler_time(full_lengths):
    plan = Planner("bucketed", full_lengths, preset_boundaries("seed6"),
                   PackingSpec(49152, 64)).epoch(0)
    plain = step_imbalance(plan, step_groups(plan, 8))
    balanced_groups = step_groups(plan, 8, balance=True, seed=3)
    balanced = step_imbalance(plan, balanced_groups)
    assert plain > 1.05 and balanced < 1.01, (plain, balanced)
    # steps still come in a shuffled order: consecutive steps are not sorted by cost
    from dflash.batching.distributed import batch_cost
    step_cost = batch_cost(plan)[balanced_groups].mean(axis=1)
    assert not (np.diff(step_cost) >= 0).all()


def test_settings_that_cannot_work_are_config_errors_naming_the_key():
    """An app prints a ConfigError as one line; a bare ValueError was a traceback."""
    import torch
    from dflash.errors import ConfigError
    from dflash.pipeline import Pipeline
    plan = Planner("sorted", np.array([10, 20, 30]), preset_boundaries("seed6"),
                   PackingSpec(64, 2), seed=0).epoch(0)
    with pytest.raises(ConfigError, match=r"ranks a batch with batching.remainder=drop"):
        shard(plan, 0, len(plan) + 1, "drop")
    with pytest.raises(ConfigError, match=r"pipeline.depth and pipeline.prefetch must be >= 0"):
        Pipeline(None, None, None, torch.device("cpu"), torch.device("cpu"), depth=-1)
