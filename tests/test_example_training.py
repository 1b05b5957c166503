import importlib.util

from conftest import REPO


def _example():
    spec = importlib.util.spec_from_file_location(
        "train_tiny_drafter", REPO / "examples" / "train_tiny_drafter.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_short_training_raises_acceptance_length():
    """The example's recipe, shortened: real speculative decoding before and after."""
    r = _example().run(target_steps=150, drafter_steps=120, train_prompts=128, eval_prompts=3,
                       eval_tokens=32, progress=False)
    assert r["target_lm_loss"][1] < 0.5 * r["target_lm_loss"][0]
    assert r["drafter_loss"][1] < 0.5 * r["drafter_loss"][0]
    assert r["lossless"]
    assert r["initial_acceptance_length"] < 1.2
    assert r["acceptance_length"] > r["initial_acceptance_length"] + 1.0
