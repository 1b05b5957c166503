"""The recipe's time estimate: the long stages priced from measured rates, and the prompt
counts scaled to a budget, never below what trains anything."""
import pytest

from dflash.recipe.estimate import MIN_PROMPTS, Estimate


def _est(prompts=1200, paths=480):
    return Estimate(regen_tokens_per_second=100.0, reply_tokens=80.0, sample_tokens=200.0,
                    train_tokens_per_second=2000.0, prompts=prompts, paths=paths, epochs=12)


def test_the_long_stages_are_priced_from_the_measured_rates():
    e = _est()
    assert e.regenerate_seconds == pytest.approx(1680 * 80 / 100)
    assert e.train_seconds == pytest.approx(12 * 1200 * 200 / 2000)
    assert "~46 min" in e.lines() and "1680 replies x 80 tokens at 100 tok/s" in e.lines()


def test_a_budget_scales_prompts_and_paths_together_and_only_when_needed():
    e = _est()
    assert e.scaled(None) == e.scaled(60) == (1200, 480)  # fits: unchanged
    prompts, paths = e.scaled(20)
    assert prompts == pytest.approx(1200 * 20 / 46.4, abs=1) and paths == pytest.approx(480 * 20 / 46.4, abs=1)
    assert e.with_counts(prompts, paths).seconds <= 20 * 60
    assert e.scaled(0.5)[0] == MIN_PROMPTS  # never below what trains anything
