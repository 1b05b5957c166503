import numpy as np
from hypothesis import given, settings, strategies as st

from dflash.batching.greedy import pack, segment_ends
from tests.helpers.packing import reference_pack


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_vectorised_packing_equals_the_rule(data):
    budget = data.draw(st.integers(1, 5000))
    cap = data.draw(st.integers(1, 80))
    lengths = np.array(data.draw(st.lists(st.integers(1, budget), min_size=1, max_size=300)))
    assert np.array_equal(pack(lengths, budget, cap), reference_pack(lengths.tolist(), budget, cap))


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_segments_are_packed_independently(data):
    budget = data.draw(st.integers(10, 2000))
    cap = data.draw(st.integers(1, 40))
    segs = data.draw(st.lists(st.lists(st.integers(1, budget), min_size=1, max_size=60),
                              min_size=1, max_size=5))
    lengths = np.concatenate([np.array(s) for s in segs])
    got = pack(lengths, budget, cap, segment_end=segment_ends([len(s) for s in segs]))
    want, base = [0], 0
    for s in segs:
        want += (reference_pack(s, budget, cap)[1:] + base).tolist()
        base += len(s)
    assert got.tolist() == want


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_each_segment_can_have_its_own_cap(data):
    """Per-bucket batch sizes: a segment packed under its own lower cap is the rule's
    packing of that segment alone with that cap."""
    budget = data.draw(st.integers(10, 2000))
    cap = data.draw(st.integers(1, 40))
    segs = data.draw(st.lists(st.lists(st.integers(1, budget), min_size=1, max_size=60),
                              min_size=1, max_size=5))
    caps = [data.draw(st.integers(1, cap)) for _ in segs]
    lengths = np.concatenate([np.array(s) for s in segs])
    position_cap = np.repeat(caps, [len(s) for s in segs])
    got = pack(lengths, budget, cap, segment_end=segment_ends([len(s) for s in segs]),
               position_cap=position_cap)
    want, base = [0], 0
    for s, c in zip(segs, caps):
        want += (reference_pack(s, budget, c)[1:] + base).tolist()
        base += len(s)
    assert got.tolist() == want


def test_budget_and_cap_are_respected_at_scale():
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 9000, 50000)
    off = pack(lengths, 49152, 64)
    sizes = np.diff(off)
    maxes = np.maximum.reduceat(lengths, off[:-1])
    assert (sizes >= 1).all() and (sizes <= 64).all()
    assert (sizes * maxes <= 49152).all()
    assert off[-1] == len(lengths)
