"""`python -m dflash.profile` writes a cost file the plan app and training then use."""
import json


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
    # a file from another model is refused, naming the field
    bad = run_module("dflash.train", *common, "eval.enabled=false", "optim.max_steps=2",
                     "model.drafter.block_size=8", f"cost={cost}",
                     f"hydra.run.dir={tmp_path / 'u'}", check=False)
    assert bad.returncode == 2 and "block_size is 16 there but 8 in this run" in bad.stderr
