import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dflash.batching import DataError, PackingSpec, Planner, STRATEGIES
from dflash.batching.boundaries import assign
from dflash.errors import ConfigError


@st.composite
def planning_problem(draw):
    budget = draw(st.integers(50, 3000))
    cap = draw(st.integers(1, 40))
    lengths = np.array(draw(st.lists(st.integers(1, budget), min_size=1, max_size=400)))
    inner = sorted(set(draw(st.lists(st.integers(1, budget), max_size=5))))
    boundaries = [0] + inner + [budget + 1]
    window = draw(st.integers(0, 6))
    seed = draw(st.integers(0, 2**31))
    return lengths, boundaries, PackingSpec(budget, cap, window), seed


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "packed"])  # test_packed.py
@settings(max_examples=60, deadline=None)
@given(problem=planning_problem(), epoch=st.integers(0, 1000))
def test_plan_invariants(strategy, problem, epoch):
    lengths, boundaries, spec, seed = problem
    planner = Planner(strategy, lengths, boundaries, spec, seed=seed)
    plan = planner.epoch(epoch)
    # every sample exactly once
    assert np.array_equal(np.sort(plan.indices), np.arange(len(lengths)))
    sizes = plan.batch_sizes
    seq = np.maximum.reduceat(lengths[plan.indices], plan.offsets[:-1])
    assert np.array_equal(seq, plan.seq_len)
    assert (sizes >= 1).all() and (sizes <= spec.max_batch_size).all()
    assert (sizes * seq <= spec.token_budget).all()
    # bucket ids follow the [lo, hi) boundaries
    b = np.asarray(boundaries)
    assert ((b[plan.bucket] <= plan.seq_len) & (plan.seq_len < b[plan.bucket + 1])).all()
    if strategy == "bucketed":
        per_sample = assign(lengths, b)[plan.indices]
        assert np.array_equal(per_sample, np.repeat(plan.bucket, sizes))
    # deterministic for (seed, epoch), from a fresh planner too
    again = Planner(strategy, lengths, boundaries, spec, seed=seed).epoch(epoch)
    assert np.array_equal(again.indices, plan.indices)
    assert np.array_equal(again.offsets, plan.offsets)
    assert np.array_equal(again.bucket, plan.bucket)
    # exact resume: batches from step s of a rebuilt plan are the original's tail
    step = len(plan) // 2
    tail = list(again.batches(start_step=step))
    assert len(tail) == len(plan) - step
    for got in tail:
        want = plan[got.index]
        assert np.array_equal(got.sample_ids, want.sample_ids)
        assert got.shape == want.shape and got.bucket_id == want.bucket_id


def test_epochs_differ_but_sorted_keeps_its_batches():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 500, 3000)
    spec = PackingSpec(2000, 16)
    sorted_p = Planner("sorted", lengths, [0, 501], spec)
    a, b = sorted_p.epoch(0), sorted_p.epoch(1)
    assert not np.array_equal(a.indices, b.indices)  # order shuffled
    as_sets = lambda p: {tuple(sorted(x.sample_ids.tolist())) for x in p.batches()}  # noqa
    assert as_sets(a) == as_sets(b)
    rand = Planner("random", lengths, [0, 501], spec)
    assert as_sets(rand.epoch(0)) != as_sets(rand.epoch(1))


def test_batch_carries_ids_bucket_and_shape():
    lengths = np.array([5, 7, 30, 31, 3])
    plan = Planner("bucketed", lengths, [0, 10, 40], PackingSpec(100, 8), seed=1).epoch(0)
    for batch in plan.batches():
        assert batch.shape == (len(batch.sample_ids), int(lengths[batch.sample_ids].max()))
        assert batch.num_tokens == int(lengths[batch.sample_ids].sum())
        assert batch.bucket_id == (0 if batch.seq_len < 10 else 1)
    with pytest.raises(IndexError, match="outside epoch"):
        plan[len(plan)]


@pytest.mark.parametrize("lengths,match", [
    ([], "no samples"),
    ([[1, 2]], "1-D"),
    ([3, -1], "sample 1 has length -1"),
    ([3, 0], "sample 1 has length 0"),
    ([1.5, 2], "non-integer"),
    (["a"], "integers"),
    ([10, 5000], "sample 1 has length 5000, more than batching.token_budget=4096"),
])
def test_bad_lengths_are_named(lengths, match):
    with pytest.raises(DataError, match=match):
        Planner("random", np.array(lengths), [0, 10**6], PackingSpec(4096, 8))


@pytest.mark.parametrize("boundaries,match", [
    ([0, 100, 50, 9000], "unsorted value 50 after 100"),
    ([0, 100, 100, 9000], "duplicate value 100"),
    ([0, 100, 200], "leave 1 samples uncovered: sample 2 has length 300"),
    ([20, 9000], "sample 0 has length 10"),
    ([0], "at least two"),
])
def test_bad_boundaries_are_named(boundaries, match):
    with pytest.raises(DataError, match=match):
        Planner("bucketed", np.array([10, 150, 300]), boundaries, PackingSpec(4096, 8))


def test_unknown_strategy():
    with pytest.raises(ConfigError, match="batching.strategy must be one of"):
        Planner("sortd", np.array([1]), [0, 2], PackingSpec(10, 1))
    with pytest.raises(ConfigError, match="seed=-1: give a seed >= 0"):  # numpy refuses it
        Planner("sorted", np.array([1]), [0, 2], PackingSpec(10, 1), seed=-1)


def test_code_asks_a_strategys_traits_not_its_name():
    """Each strategy is registered with its traits; outside the registry (and the plot's
    labels) no code compares a strategy's name, so a new strategy is one entry."""
    import re
    from dflash.batching.strategies import REGISTRY, traits
    from tests.helpers.paths import REPO
    assert [n for n, s in REGISTRY.items() if s.packs_rows] == ["packed"]
    assert [n for n, s in REGISTRY.items() if s.uses_buckets] == ["bucketed"]
    assert traits("sorted").static and not traits("random").static
    pattern = re.compile(r"strategy\)?\s*[!=]=\s*[\"']")
    named = [str(p.relative_to(REPO)) for p in (REPO / "dflash").rglob("*.py")
             if p.name not in ("strategies.py", "plan_plot.py") and pattern.search(p.read_text())]
    assert named == []
