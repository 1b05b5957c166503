"""Speculative decoding: batched, KV-cached, lossless, and the rejection rule."""
import pytest
import torch
from omegaconf import OmegaConf

from dflash.config import TargetConfig
from dflash.decode import NgramProposer, speculative_decode
from dflash.decode.speculative import _accept
from tests.helpers.decoding import target_greedy
from dflash.model.target import Target
from tests.helpers.models import random_prompts as _prompts


@pytest.fixture(scope="module")
def target():
    return Target.from_config(OmegaConf.structured(TargetConfig()))




def test_stops_at_eos_and_clamps_the_last_step(target):
    p = _prompts(1)[0]
    ref = target_greedy(target, p, 12)
    eos = ref[5]
    first = ref.index(eos)
    ngram = NgramProposer([p + ref], order=2)  # drafts the target's own continuation
    res = speculative_decode(target, ngram, [p], 12, eos_token_id=eos)
    assert res.tokens[0] == ref[:first + 1]
    res = speculative_decode(target, ngram, [p], 7)
    assert res.tokens[0] == ref[:7] and sum(res.accept_lengths[0]) == 7


def test_rejection_rule():
    g = torch.Generator().manual_seed(0)
    v = 6
    p = torch.softmax(torch.randn(1, 4, v, generator=g), -1)
    logits = torch.log(p)
    drafts = torch.tensor([[1, 2, 3]])
    # q == p: every draft is accepted (u <= 1), the bonus comes from the last position
    n, _ = _accept(logits, drafts, p[:, :3].clone(), 1.0, g)
    assert int(n) == 3
    # a draft the target gives probability 0 is always rejected and never resampled
    p0 = p.clone()
    p0[0, 0, 1] = 0
    p0 = p0 / p0.sum(-1, keepdim=True)
    q = torch.full((1, 3, v), 1.0 / v)
    for _ in range(20):
        n, nxt = _accept(torch.log(p0.clamp_min(1e-30)), drafts, q, 1.0, g)
        assert int(n) == 0 and int(nxt) != 1


def test_the_drafter_beats_a_baseline_only_when_the_paired_interval_says_so():
    from dflash.eval.baselines import paired_difference
    from dflash.eval.report import Score
    steps = [10, 12, 8, 11, 9, 10, 13, 7]
    per = [1.2, 1.1, 1.3, 1.0, 1.2, 1.1, 1.4, 1.0]
    base = Score(1.16, per, steps, sum(steps))
    same = paired_difference(base, base)
    assert same.difference == 0 and same.lo == same.hi == 0 and not same.better
    up = Score(1.66, [x + 0.5 for x in per], steps, sum(steps))
    d = paired_difference(up, base)
    assert abs(d.difference - 0.5) < 1e-9 and d.better and d.lo > 0
    noisy = Score(1.2, [x + (0.9 if i % 2 else -0.8) for i, x in enumerate(per)], steps, sum(steps))
    assert not paired_difference(noisy, base).better

def test_an_eval_report_reads_back_as_the_record_it_was_written_from():
    """The eval app's JSON is its report record's: what a reader takes back (from_json) is
    the record written, sections not measured left out of the file, not written as null."""
    import json
    from dflash.eval.report import Baseline, Difference, EvalReport, PathsReport
    b = Baseline(1.2, [1.2], [5], 5, 6, {"lo": 1.0, "hi": 1.4, "half_width": 0.2},
                 Difference(0.3, 0.1, 0.5, True))
    decoded = EvalReport("d", "p.jsonl", "chat", 0.0, 0.0, 8, 1.5, [1.5], [4], [2, 2], 4, 6,
                         [[1]], [[2, 3]], [1], {"lo": 1.2, "hi": 1.8}, baselines={"lookup": b})
    walked = EvalReport("d", paths=PathsReport(1.6, [1.6], [10], 10, replies=3, data="x",
                                               baselines={"lookup": b}))
    for report in (decoded, walked):
        text = json.dumps(report.to_json())
        assert EvalReport.from_json(json.loads(text)) == report
    assert set(walked.to_json()) == {"drafter", "paths"}  # no decoded fields, no nulls
    assert "generated_tokens" not in walked.to_json()["paths"]
