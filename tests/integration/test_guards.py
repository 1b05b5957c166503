"""NaN/inf guards: stop naming the step and samples, or skip the update and count it."""
import pytest
import torch

from tests.helpers.run import build_trainer, QUIET
from dflash.errors import DataError
from dflash.loggers import Logger


def _poisoned(cache, out, overrides, bad_calls):
    r = build_trainer(cache, out, *QUIET, "pipeline.depth=0", "warmup=none", "epochs=1",
                      "optim.max_steps=8", "logger.log_every=4", *overrides)
    real, calls = r.train_step.context, []

    def context(b):  # the target's context of some batches turns NaN
        calls.append(b.batch)
        ctx = real(b)
        return ctx * float("nan") if len(calls) in bad_calls else ctx
    r.train_step.context = context
    return r, calls


def test_nonfinite_stop_names_step_and_samples(tmp_path, world_cache):
    r, calls = _poisoned(world_cache, tmp_path, [], bad_calls={3})
    before = {k: v.clone() for k, v in r.drafter.state_dict().items()}
    with pytest.raises(DataError) as exc:
        r.train(Logger())
    bad = calls[2]
    ids = [int(i) for i in bad.sample_ids[:8]]
    assert f"at step 3 (epoch 0, batch {bad.index}, samples {ids}" in str(exc.value)
    assert "optim.nonfinite=skip" in str(exc.value)
    assert len(calls) == 4  # found at the sync after step 4, not later
    assert any(not torch.equal(before[k], v) for k, v in r.drafter.state_dict().items())


def test_nonfinite_skip_keeps_training_finite(tmp_path, world_cache):
    r, _ = _poisoned(world_cache, tmp_path, ["optim.nonfinite=skip"], bad_calls={2, 5})
    summary = r.train(Logger())
    assert summary["skipped_steps"] == [2, 5] and summary["steps"] == 8
    assert all(torch.isfinite(v).all() for v in r.drafter.state_dict().values())
    assert summary["final_loss"] == summary["final_loss"]  # not NaN


def test_too_many_skips_stop(tmp_path, world_cache):
    r, _ = _poisoned(world_cache, tmp_path, ["optim.nonfinite=skip", "optim.max_skips=1"],
                     bad_calls={2, 3})
    with pytest.raises(DataError, match="2 steps had a NaN/inf loss or gradient, more than "
                                        "optim.max_skips=1"):
        r.train(Logger())


def test_the_world_data_is_checked_for_the_mask_token_like_every_source(world_cache):
    """data=world (the default) holds ids 0..vocab-2; a mask token it uses is refused
    before training, naming the sample, as for tokenized data."""
    from dflash.sources import build_sources
    from tests.helpers.run import train_config
    with pytest.raises(DataError, match=r"sample \d+ holds token id 7, the drafter's mask token"):
        build_sources(train_config(world_cache, "model.drafter.mask_token_id=7"), progress=False)
    assert build_sources(train_config(world_cache), progress=False).mask_token_id == 511
