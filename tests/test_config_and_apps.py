import json

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import dflash.config  # noqa: F401
from conftest import REPO, run_module

CONF = str(REPO / "dflash" / "conf")
GROUPS = {g: sorted(p.stem for p in (REPO / "dflash" / "conf" / g).glob("*.yaml"))
          for g in ("data", "model", "batching", "buckets", "warmup", "topology", "logger")}


def _compose(name, overrides=()):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_group_option_composes(group):
    for option in GROUPS[group]:
        cfg = _compose("train", [f"{group}={option}"])
        assert OmegaConf.is_missing(cfg[group], "path") or cfg[group] is not None


def test_defaults_and_experiment():
    cfg = _compose("plan", ["experiment=compare_batching"])
    assert cfg.data.num_samples == 902087 and cfg.batching.token_budget == 49152
    assert cfg.batching.max_batch_size == 64
    assert list(_compose("plan").buckets.boundaries) == [0, 770, 1216, 1728, 2432, 3296, 8192]


@pytest.mark.parametrize("override,match", [
    ("batching.tokn_budget=10", "tokn_budget"),
    ("batching.token_budget=lots", "token_budget"),
    ("data.num_sampels=3", "num_sampels"),
    ("buckets=seed7", "seed7"),
    ("batching.strategy=sortd", "expected one of \\[sorted, random, bucketed, megabatch, packed\\]"),
    ("data.overlong=cut", "data.overlong"),
])
def test_bad_overrides_name_the_key(override, match):
    import re
    with pytest.raises(ConfigCompositionException) as info:
        _compose("plan", [override])
    text = f"{info.value} {info.value.__cause__}"  # Hydra chains the validation error
    assert re.search(match, text), text


def test_misspelled_key_in_a_preset_file(tmp_path):
    (tmp_path / "buckets").mkdir()
    (tmp_path / "buckets" / "typo.yaml").write_text("name: typo\nkind: fixed\nboundary: [0, 10]\n")
    with pytest.raises(ConfigCompositionException, match="boundary"):
        _compose("plan", [f"hydra.searchpath=[file://{tmp_path}]", "buckets=typo"])


_run = run_module


def test_plan_app_report_and_dump(tmp_path):
    rng = np.random.default_rng(0)
    lengths = rng.integers(65, 8192, 3000)
    np.save(tmp_path / "len.npy", lengths)
    out = _run("dflash.plan", f"lengths_file={tmp_path}/len.npy", "batching=bucketed",
               "buckets=seed6", "epochs=3", "seed=5", f"report={tmp_path}/r.json",
               f"dump={tmp_path}/dump", "topology.dp_size=4", f"hydra.run.dir={tmp_path}/run")
    assert "padding_efficiency=" in out.stdout and "per bucket" in out.stdout
    (rep,) = json.loads((tmp_path / "r.json").read_text())
    for key in ("strategy", "num_samples", "useful_tokens", "padded_tokens", "padding_efficiency",
                "num_batches", "pair_repeat_rate", "length_mixing", "plan_seconds", "buckets"):
        assert key in rep
    assert set(rep["buckets"][0]) >= {"lo", "hi", "samples", "batches", "mean_batch_size",
                                      "efficiency"}
    assert rep["useful_tokens"] == int(lengths.sum()) and rep["distributed"]["world_size"] == 4
    for e in range(3):
        z = np.load(tmp_path / "dump" / f"epoch{e}.npz")
        assert z["indices"].dtype == np.int64 and z["offsets"].dtype == np.int64
        assert z["bucket"].dtype == np.int32
        assert np.array_equal(np.sort(z["indices"]), np.arange(3000))
        assert len(z["bucket"]) == len(z["offsets"]) - 1
    assert not (tmp_path / "dump" / "epoch3.npz").exists()
    z0 = np.load(tmp_path / "dump" / "epoch0.npz")
    assert rep["num_batches"] == len(z0["bucket"])


def test_plan_multirun_fills_one_report(tmp_path):
    np.save(tmp_path / "len.npy", np.random.default_rng(1).integers(1, 4000, 2000))
    _run("dflash.plan", "--multirun", "batching=sorted,random,megabatch",
         f"lengths_file={tmp_path}/len.npy", f"report={tmp_path}/r.json",
         f"plot={tmp_path}/tradeoff.png", f"hydra.sweep.dir={tmp_path}/multi")
    reps = json.loads((tmp_path / "r.json").read_text())
    assert sorted(r["strategy"] for r in reps) == ["megabatch", "random", "sorted"]
    assert (tmp_path / "tradeoff.png").read_bytes()[:4] == b"\x89PNG"
    # rerunning one strategy replaces its entry instead of appending a duplicate
    _run("dflash.plan", "batching=random", f"lengths_file={tmp_path}/len.npy",
         f"report={tmp_path}/r.json", f"hydra.run.dir={tmp_path}/again")
    assert len(json.loads((tmp_path / "r.json").read_text())) == 3


def test_plan_app_bad_input_fails_clearly(tmp_path):
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    proc = _run("dflash.plan", f"lengths_file={tmp_path}/bad.npy",
                f"hydra.run.dir={tmp_path}/run", check=False)
    assert proc.returncode != 0 and "bad.npy is not a readable .npy array" in proc.stderr
    np.save(tmp_path / "long.npy", np.array([100, 60000]))
    proc = _run("dflash.plan", f"lengths_file={tmp_path}/long.npy", "data.max_seq_len=100000",
                f"hydra.run.dir={tmp_path}/run", check=False)
    assert proc.returncode != 0 and "sample 1 has length 60000" in proc.stderr


@pytest.mark.parametrize("case", ["negative", "missing", "unsorted"])
def test_user_errors_end_with_one_message_not_a_traceback(tmp_path, case):
    np.save(tmp_path / "neg.npy", np.array([5, -3, 7]))
    args = {"negative": [f"lengths_file={tmp_path}/neg.npy"],
            "missing": [f"lengths_file={tmp_path}/nope.npy"],
            "unsorted": ["buckets.kind=fixed", "buckets.boundaries=[1,500,200,9000]"]}[case]
    proc = _run("dflash.plan", *args, f"hydra.run.dir={tmp_path}/run", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("dflash: error:") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_dump_keeps_original_ids_when_overlong_samples_are_dropped(tmp_path):
    lengths = np.array([10, 9000, 20, 30, 9500, 40])
    np.save(tmp_path / "len.npy", lengths)
    _run("dflash.plan", f"lengths_file={tmp_path}/len.npy", "data.max_seq_len=8192",
         "data.overlong=drop", "epochs=1", f"dump={tmp_path}/d", f"report={tmp_path}/r.json",
         f"hydra.run.dir={tmp_path}/run")
    z = np.load(tmp_path / "d" / "epoch0.npz")
    assert sorted(z["indices"].tolist()) == [0, 2, 3, 5]
    (rep,) = json.loads((tmp_path / "r.json").read_text())
    assert rep["data"]["overlong_samples"] == 2 and rep["num_samples"] == 4


def test_train_rejects_data_outside_the_target_vocabulary(tmp_path):
    from omegaconf import OmegaConf
    from dflash.config import TargetConfig
    from dflash.model.target import build_tiny_qwen3
    build_tiny_qwen3(OmegaConf.structured(TargetConfig(vocab_size=256))).save_pretrained(tmp_path / "m")
    proc = _run("dflash.train", "data=synthetic", "data.num_samples=50",
                f"data.cache_dir={tmp_path}/cache", f"model.target.path={tmp_path}/m", f"hydra.run.dir={tmp_path}/run", check=False)
    assert proc.returncode != 0
    assert "outside the model vocabulary of 256" in proc.stderr


@pytest.mark.parametrize("exp", ["compare_shuffles", "production", "cpu_smoke"])
def test_train_experiments_compose(exp):
    cfg = _compose("train", [f"experiment={exp}"])
    assert cfg.model.drafter.num_anchors > 0
    if exp == "compare_shuffles":
        assert cfg.optim.max_tokens > 0 and cfg.logger.name == "wandb"
        import yaml
        doc = yaml.safe_load((REPO / "dflash" / "conf" / "experiment" / "compare_shuffles.yaml").read_text())
        assert doc["hydra"]["sweeper"]["params"]["shuffle"].split(",") == [
            "sorted", "random", "bucketed_quantile", "bucketed_geometric", "megabatch", "packed"]
        for s in doc["hydra"]["sweeper"]["params"]["shuffle"].split(","):
            _compose("train", [f"experiment={exp}", f"shuffle={s}"])
        assert cfg.logger.mode in ("offline", "disabled")  # no account needed
