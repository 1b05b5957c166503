"""Acceptance along greedy replies (dflash.eval.paths): the verify steps real greedy
speculative decoding takes, known from the reply alone."""
import numpy as np

from dflash.data.format import DatasetWriter
from dflash.decode import (DrafterProposer, NgramProposer, PromptLookupProposer,
                                speculative_decode)
from dflash.eval.paths import compare_on_paths, decoder_steps, history_steps, replies
from tests.helpers.models import random_prompts, tiny_drafter, tiny_target


def test_walking_a_greedy_reply_takes_the_steps_decoding_takes(tmp_path):
    target = tiny_target()
    prompts = random_prompts(6)
    greedy = speculative_decode(target, PromptLookupProposer(block_size=1), prompts, 24).tokens
    w = DatasetWriter(tmp_path / "d", vocab_size=target.vocab_size)
    for p, r in zip(prompts, greedy):
        w.add(p + r, [0] * len(p) + [1] * len(r))
    ds = w.close()
    seqs, firsts = replies(ds)
    assert [s[f:].tolist() for s, f in zip(seqs, firsts)] == greedy
    decoders = (DrafterProposer(tiny_drafter(target), target), PromptLookupProposer(block_size=8),
                NgramProposer(seqs[:3], block_size=8))  # half the replies: some accepted
    for proposer in decoders:
        dec = speculative_decode(target, proposer, prompts, 24)
        assert dec.tokens == greedy  # lossless: the walk's premise
        assert decoder_steps(proposer, target, seqs, firsts) == dec.accept_lengths
    assert any(max(s) > 1 for s in dec.accept_lengths)  # drafts were accepted
    report = compare_on_paths(target, tiny_drafter(target), {"lookup": decoders[1]}, ds)
    lookup = report.baselines["lookup"]
    got = speculative_decode(target, decoders[1], prompts, 24)
    assert lookup.acceptance_length == sum(map(sum, got.accept_lengths)) / sum(
        map(len, got.accept_lengths))
    d = lookup.drafter_minus_this
    assert d.lo <= d.difference <= d.hi and report.replies == 6


def test_a_step_emits_the_anchor_and_its_matching_drafts_clamped_at_the_end():
    seq = np.array([9, 9, 1, 2, 3, 4, 5, 6])  # prompt 9 9, reply from index 2
    always = lambda hist: [hist[-1] + 1, hist[-1] + 2, 0]  # noqa: E731
    # anchor 1: drafts 2 3 match (0 does not) -> 3 tokens; anchor 4: 5 6, then the end
    assert history_steps(always, seq, 2) == [3, 3]
    assert history_steps(lambda hist: [7, 7, 7], seq, 2) == [1] * 6


def test_a_sampled_walk_is_refused_in_one_line():
    """The walk is greedy acceptance only: a temperature is refused before any work."""
    import pytest
    from omegaconf import OmegaConf

    from dflash.errors import ConfigError
    from dflash.evaluate import walked
    cfg = OmegaConf.create({"temperature": 0.7, "paths": "/nowhere", "baselines": [],
                            "ngram_data": None})
    with pytest.raises(ConfigError, match="temperature=0 only"):
        walked(cfg, None, None)


def test_the_eval_app_without_prompts_or_paths_names_both():
    import pytest
    from omegaconf import OmegaConf

    from dflash.errors import DataError
    from dflash.evaluate import main_app
    with pytest.raises(DataError, match="prompts=FILE .* or paths=DIR"):
        main_app(OmegaConf.create({"drafter": "/d", "prompts": None, "paths": None}))
