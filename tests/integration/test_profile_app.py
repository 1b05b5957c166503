"""`python -m dflash.profile` writes a cost file the plan app and training then use."""
import json

import numpy as np

from tests.helpers.run import WORLD, run_module


def test_profile_then_plan_and_train_with_the_cost_file(tmp_path, world_cache):
    cost = tmp_path / "cost.json"
    common = [*WORLD, f"data.cache_dir={world_cache}", "logger.progress=false"]
    run_module("dflash.profile", *common, "profile.reps=1", "profile.max_shapes=6", "profile.grid=2",
               "profile.calibrate_steps=6",
               f"profile.out={cost}", f"hydra.run.dir={tmp_path / 'p'}")
    doc = json.loads(cost.read_text())
    assert doc["identity"]["step_kind"] == "padded" and len(doc["points"]) >= 6
    assert all(p["switch_seconds"] > 0 for p in doc["points"]) and doc["model"]["switch"] is not None
    assert all(c >= 0 for c in doc["model"]["coef"]) and "heldout_mean_abs_error" in doc["fit"]
    cal = doc["fit"]["calibration"]  # real steps of the run, priced by the bare model
    assert cal["steps"] == 6 and cal["measured_seconds"] > 0 and cal["predicted_seconds"] > 0
    proc = run_module("dflash.plan", "data=world", *common[:-1], "epochs=1", f"cost={cost}",
                      "batching.token_budget=4096", "batching.max_batch_size=16",
                      "warmup.pad_to_multiple=8", f"hydra.run.dir={tmp_path / 'q'}")
    assert "s per epoch" in proc.stdout and "real tokens/s" in proc.stdout
    run = tmp_path / "t"
    run_module("dflash.train", *common, "eval.enabled=false", "optim.max_steps=10", "warmup=none",
               "logger.log_every=5", f"cost={cost}", f"hydra.run.dir={run}")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["predicted_train_seconds"] > 0
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["predicted_step_seconds"] > 0 and r["step_seconds"] > 0 for r in recs)
    # a file from another model is refused, naming the field, before any work (the
    # evaluation before training ran first, and the warmup)
    bad = run_module("dflash.train", *common[:-1], "optim.max_steps=2",
                     "model.drafter.block_size=8", f"cost={cost}",
                     f"hydra.run.dir={tmp_path / 'u'}", check=False)
    assert bad.returncode == 2 and "block_size is 16 there but 8 in this run" in bad.stderr
    assert "eval before training" not in bad.stderr


def test_preflight_predicts_the_epoch_from_a_cost_file(tmp_path, world_cache):
    """`cost=FILE` on a checked train command: the first epoch priced step by step at
    the shapes it runs at; a file of another model is refused naming the field."""
    from dflash.batching.step_cost import CostModel, write_cost_file
    from dflash.config import compose
    from dflash.preflight.checks import check
    from dflash.preflight.command import parse
    from dflash.preflight.world import World
    from dflash.warmup.profile import model_identity
    common = [*WORLD, f"data.cache_dir={world_cache}", f"hydra.run.dir={tmp_path / 'r'}"]
    ident = {"device": "NVIDIA H100", "device_count": 1, "autocast": "bf16",
             **model_identity(compose("train", common))}
    model = CostModel(np.array([0.01, 0.0, 1e-6, 0.0, 0.0, 0.0]),
                      {"rows": 64, "seq_len": 4096, "anchors": 64})
    cost = write_cost_file(tmp_path / "cost.json", ident, model, [], {})
    rep = check(parse("python -m dflash.train " + " ".join([*common, f"cost={cost}"])),
                World.parse("cpu"))
    rows = dict(rep.rows)
    steps = int(rows["steps"].split()[0].replace(",", ""))
    seconds = float(rows["epoch time"].split()[0].replace(",", ""))
    assert rep.ok and "predicted for epoch 0 on NVIDIA H100 x 1" in rows["epoch time"]
    assert seconds >= 0.01 * steps  # every step pays the constant term at least
    other = check(parse("python -m dflash.train " + " ".join(
        [*common, f"cost={cost}", "model.drafter.block_size=8"])), World.parse("cpu"))
    assert "block_size is 16 there but 8 in this run" in other.refused
