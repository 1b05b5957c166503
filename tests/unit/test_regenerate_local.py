"""The local backend's sampling and its compiled path: a batch's samples are seeded (a
rerun writes the same text), top-p near 0 is greedy, and the static-cache compiled path
writes the tokens the eager path writes, greedy or sampled."""
import pytest
import torch
from omegaconf import OmegaConf

from dflash.config import TargetConfig
from dflash.decode.backend import Sampling
from dflash.decode.local import Compiled, LocalBackend, greedy_proposer
from dflash.model.target import Target

PROMPTS = [[5, 9, 11, 40], [7, 7, 8, 100, 101, 102, 3], [50]]


@pytest.fixture(scope="module")
def target():
    return Target.from_config(OmegaConf.structured(TargetConfig(vocab_size=208))).eval()


def _ids(backend, batch=0):
    with torch.no_grad():
        return [o["ids"] for o in backend.decode_ids(PROMPTS, batch)]


def test_sampling_is_seeded_per_batch_and_top_p_near_zero_is_greedy(target):
    sample = LocalBackend(target, [], Sampling(temperature=1.0, max_new_tokens=12, seed=3))
    first = _ids(sample, 0)
    assert _ids(sample, 0) == first and _ids(sample, 1) != first
    assert _ids(LocalBackend(target, [], Sampling(temperature=1.0, max_new_tokens=12, seed=4)), 0) != first
    greedy = _ids(LocalBackend(target, [], Sampling(max_new_tokens=12)))
    assert _ids(LocalBackend(target, [], Sampling(temperature=1.0, top_p=1e-9, max_new_tokens=12))) == greedy
    assert all(len(row) == 12 for row in first)  # no stop token: every row runs to the cap


def test_the_compiled_static_cache_path_writes_the_eager_paths_tokens(target):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    try:
        for temperature in (0.0, 1.0):
            sampling = Sampling(temperature=temperature, max_new_tokens=12, seed=3)
            eager = LocalBackend(target, [], sampling)
            # eager backend: dynamo's graphs over the static cache, no code generation
            compiled = LocalBackend(target, [], sampling,
                                    compiled=Compiled("eager", pad_to_multiple=16))
            assert _ids(compiled, 2) == _ids(eager, 2), temperature
        assert counters["stats"]["unique_graphs"] >= 1  # the decode step ran compiled
    finally:
        torch._dynamo.reset()  # later tests count compiles from zero


def test_every_greedy_decoding_writes_the_targets_greedy_tokens(target):
    """plain, lookup and auto (which switches between them mid-batch) are all the
    target's own greedy decoding: equal to HF generate's."""
    hf = LocalBackend(target, [], Sampling(max_new_tokens=12))
    with torch.no_grad():
        ref = [hf._finish(list(map(int, t)))["ids"] for t in hf._hf_generate(PROMPTS, 0, False)]
    for decoding in ("plain", "lookup", "auto"):
        backend = LocalBackend(target, [], Sampling(max_new_tokens=12),
                               greedy_proposer(target, decoding=decoding))
        assert _ids(backend) == ref, decoding
        assert backend.decoding.startswith(decoding)


def test_auto_runs_whichever_block_size_measures_faster():
    from dflash.decode.adaptive import AdaptiveProposer

    class Lookup:
        block_size = 4

        def drafts(self, session, current):
            return current.new_zeros((len(current), 3))

    def run(rates, steps=200):
        p = AdaptiveProposer(Lookup(), explore=3, recheck=20)
        picked = []
        for _ in range(steps):
            d = p.drafts(None, torch.zeros(2, dtype=torch.long))
            k = d.shape[1] + 1
            picked.append(k)
            p.observe(tokens=rates[k], seconds=1.0)  # tokens/s of each size
        return picked, p.choice

    picked, choice = run({1: 10.0, 4: 25.0})  # drafts accepted: lookup pays
    assert choice == "lookup" and picked[-50:].count(4) > 40 and picked.count(1) >= 3
    picked, choice = run({1: 10.0, 4: 6.0})  # drafts rejected: plain decoding
    assert choice == "plain" and picked[-50:].count(1) > 40 and picked.count(4) >= 3


def test_auto_is_not_left_to_timing_where_the_decodings_differ():
    """In half precision plain and prompt-lookup decoding part at near ties: auto's
    timing-based choice would make the replies depend on the load (a sharded target's
    ranks must agree too), so it decodes plainly there; float32 keeps auto."""
    from types import SimpleNamespace as NS
    from dflash.regenerate import auto_decoding
    cfg = lambda dec, dtype: NS(decoding=dec, model=NS(target=NS(dtype=dtype)))  # noqa: E731
    assert auto_decoding(cfg("auto", "float32"), 1) is None
    assert auto_decoding(cfg("auto", "bfloat16"), 1) == "plain"
    assert auto_decoding(cfg("auto", "float32"), 2) == "plain"
    assert auto_decoding(cfg("lookup", "bfloat16"), 1) is None  # asked for: kept
