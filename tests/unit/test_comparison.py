"""The comparison's statistics: intervals over seeds, paired verdicts that never pick a
winner from overlapping intervals, the eval's bootstrap, time to a target acceptance."""
import pytest

from dflash.comparison.stats import bootstrap_acceptance, first_crossing, interval, paired_verdict
from dflash.comparison.table import group_rows, job_rows
from dflash.run_summary import RunSummary


def _summary(seed, final, curve, seconds, strategy="sorted", tok_s=1000.0):
    return ({"shuffle": strategy, "seed": str(seed)}, RunSummary(**{
             "seed": seed, "strategy": strategy, "train_seconds": seconds, "steps": 100,
             "real_tokens": 50_000, "initial_acceptance_length": 1.0, "acceptance_length": final,
             "tokens_per_second": tok_s, "padding_efficiency": 0.9, "length_mixing": 0.2,
             "pair_repeat_rate": 0.0, "final_loss": 1.0,
             "eval_curve": [{"train_seconds": t, "step": st, "real_tokens": 0,
                             "acceptance_length": a} for t, st, a in curve],
             "eval": {"after": {"per_prompt": [final - 0.1, final + 0.1, final],
                                "per_prompt_steps": [10, 10, 20]}}}))


def test_interval_is_a_t_interval_and_absent_for_one_seed():
    v = interval([1.0, 2.0, 3.0])
    assert v["mean"] == 2.0 and v["n"] == 3
    assert v["hi"] - 2.0 == pytest.approx(4.302653 * 1.0 / 3 ** 0.5, rel=1e-5)
    assert interval([5.0])["lo"] is None and interval([])["mean"] is None


def test_verdict_names_a_difference_only_when_the_paired_interval_excludes_zero():
    clear = paired_verdict({0: 3.0, 1: 3.1, 2: 3.2}, {0: 2.0, 1: 2.1, 2: 2.25}, True)
    assert clear["significant"] and clear["verdict"].startswith("better by")
    # overlapping, noisy: no winner picked
    noisy = paired_verdict({0: 3.0, 1: 2.0, 2: 3.5}, {0: 2.5, 1: 2.6, 2: 3.4}, True)
    assert not noisy["significant"] and noisy["verdict"].startswith("no difference detectable")
    # lower is better (time to target)
    faster = paired_verdict({0: 10.0, 1: 11.0, 2: 12.0}, {0: 20.0, 1: 21.0, 2: 23.0}, False)
    assert faster["significant"] and faster["mean"] == pytest.approx(10.333, rel=1e-3)
    assert "one seed" in paired_verdict({0: 1.0}, {0: 2.0}, True)["verdict"]


def test_bootstrap_is_pooled_over_prompts_and_first_crossing_interpolates():
    b = bootstrap_acceptance([2.0, 4.0], [10, 30], draws=500)
    assert 2.0 <= b["lo"] <= 3.5 <= b["hi"] <= 4.0 and b["prompts"] == 2
    assert bootstrap_acceptance([3.0] * 5, [4] * 5)["half_width"] == 0.0
    assert first_crossing([0, 10, 20], [1.0, 2.0, 4.0], 3.0) == pytest.approx(15.0)
    assert first_crossing([0, 10], [1.0, 2.0], 3.0) is None


def test_rows_group_seeds_and_judge_against_the_best():
    jobs = [_summary(s, 3.0 + 0.05 * s, [(5.0, 50, 2.0 + 0.1 * s)], 10.0, "sorted")
            for s in range(3)]
    jobs += [_summary(s, 2.0 + 0.05 * s, [(10.0, 50, 1.5)], 20.0, "random", tok_s=500.0)
             for s in range(3)]
    rows = job_rows(jobs)
    assert [r["group"] for r in rows] == ["shuffle=sorted"] * 3 + ["shuffle=random"] * 3
    assert rows[0]["target_acceptance"] == 2.0  # the lowest final: every job reaches it
    # at 10 s (the shortest job) random is halfway from 1.5 (10 s) to its final (20 s)
    assert rows[3]["acceptance_at_equal_time"] == pytest.approx(1.5)
    assert rows[0]["time_to_target"] == pytest.approx(5.0)  # 2.0 reached at the eval point
    assert rows[3]["time_to_target"] == pytest.approx(20.0)
    groups = {g["group"]: g for g in group_rows(rows)}
    s, r = groups["shuffle=sorted"], groups["shuffle=random"]
    assert s["acceptance_length"]["n"] == 3 and s["acceptance_length"]["lo"] is not None
    assert s["verdicts"]["acceptance_length"]["verdict"] == "best"
    assert r["verdicts"]["acceptance_length"]["significant"]  # 1.0 better on every seed
    assert r["verdicts"]["time_to_target"]["against"] == "shuffle=sorted"


def test_the_per_job_table_shows_predicted_beside_measured_time():
    from dflash.comparison.report import format_markdown
    jobs = [_summary(s, 3.0, [(5.0, 50, 2.0)], 10.0 + s) for s in range(2)]
    jobs[0][1].predicted_train_seconds = 9.5  # a job run with cost=FILE
    rows = job_rows(jobs)
    md = format_markdown(rows, group_rows(rows), None)
    assert "| 10.0 (9.5) |" in md and "| 11.0 |" in md


def test_the_speedup_interval_is_the_ratio_of_sums_resampled_over_prompts():
    """eval speed=true's interval: drafter tokens/s over plain tokens/s, both pooled
    over the prompts, resampled in pairs; equal decoders give 1 exactly."""
    from dflash.eval.speed import ratio_interval
    tok, sec = [10, 20, 30, 40], [1.0, 2.0, 2.0, 5.0]
    same = ratio_interval(tok, sec, tok, sec)
    assert same == {"value": 1.0, "lo": 1.0, "hi": 1.0}
    twice = ratio_interval(tok, [s / 2 for s in sec], tok, sec)
    assert twice["value"] == 2.0 and twice["lo"] == twice["hi"] == 2.0
    mixed = ratio_interval([10, 10], [1.0, 4.0], [10, 10], [2.0, 2.0])
    assert mixed["value"] == (20 / 5) / (20 / 4) and mixed["lo"] < mixed["value"] < mixed["hi"]
