"""A DSpark drafter through the train app: the heads train, the export is DSpark's, the
summary carries the confidence head's calibration, and heads without their loss are refused."""
import json

import pytest

from dflash.errors import ConfigError
from dflash.model.checkpoint import load_drafter
from tests.helpers.run import WORLD, build_trainer, run_module


def test_a_dspark_drafter_trains_exports_and_reports_its_calibration(tmp_path, world_cache):
    # anchor-first: the layout whose slots and drafts differ most from the default one
    # (the default layout's heads are covered by tests/unit/test_dspark.py)
    head = "dspark_anchor_first"
    run = tmp_path / "run"
    run_module("dflash.train", *WORLD, f"data.cache_dir={world_cache}", "loss=dspark",
               f"drafter_head={head}", "model.drafter.markov_rank=32", "optim.max_steps=16",
               "logger.progress=false", "eval.confidence_stop=0.3", f"hydra.run.dir={run}")
    s = json.loads((run / "summary.json").read_text())
    assert s["final_loss"] < s["initial_loss"]
    cal = s["eval"]["after"]["calibration"]
    n_drafts = 16 if head == "dspark_anchor_first" else 15
    assert len(cal["per_slot"]) == n_drafts and cal["trials"] > 0
    first = cal["per_slot"][0]
    assert 0 <= first["predicted"] <= 1 and 0 <= first["observed"] <= 1 and 0 <= cal["ece"] <= 1
    # decoding with the stop: as many histogram bins as a block verifies tokens
    assert len(s["eval"]["after"]["histogram"]) == n_drafts + 1
    cfg = json.loads((run / "drafter" / "config.json").read_text())
    assert cfg["architectures"] == ["DSparkDraftModel"] and cfg["markov_rank"] == 32
    assert cfg["confidence_head"] is True
    assert cfg["sample_from_anchor"] is (head == "dspark_anchor_first")
    d = load_drafter(run / "drafter")
    assert d.markov_head.markov_w2.weight.abs().sum() > 0  # W2 left zero-init: it trained


def test_heads_without_their_objective_are_refused_at_build(tmp_path, world_cache):
    with pytest.raises(ConfigError, match="trains with loss=dspark"):
        build_trainer(world_cache, tmp_path / "a", "drafter_head=dspark", "logger.progress=false",
                      "eval.enabled=false")
