import re

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from dflash.config import compose
from tests.helpers.paths import CONF, REPO
from tests.helpers.run import run_module

GROUPS = {g: sorted(p.stem for p in (CONF / g).glob("*.yaml"))
          for g in ("data", "model", "batching", "buckets", "warmup", "topology", "logger", "loss")}


_run = run_module

def _compose(name, overrides=()):
    return compose(name, overrides)


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
    ("loss.norm=tokens", "loss.norm"),
    ("loss.kind=mse", "loss.kind"),
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


def test_a_mask_token_outside_the_embedding_is_refused_naming_the_key():
    from dflash.errors import ConfigError
    from dflash.model.drafter import mask_token_id
    cfg = OmegaConf.create({"mask_token_id": None})
    assert mask_token_id(cfg, 500) == 499
    for bad in (500, -1):
        with pytest.raises(ConfigError, match=rf"model.drafter.mask_token_id={bad} is outside"):
            mask_token_id(OmegaConf.create({"mask_token_id": bad}), 500)


def test_production_checkpoints_on_a_clock_and_resumes():
    cfg = _compose("train", ["experiment=production"])
    assert cfg.checkpoint.every_minutes > 0 and str(cfg.resume) == "auto"
    assert str(cfg.checkpoint.dtype) == "bfloat16"


def test_the_public_dflash_package_beside_this_one_is_named(monkeypatch):
    """Both import as `dflash`: installed together, one shadows the other; every app says
    so first (this project is the distribution dflash-trainer)."""
    from importlib import metadata
    from dflash.config import check_import_clash
    found = {"dflash": "0.1.0", "dflash-trainer": "0.2.0"}

    def distribution(name):
        if name not in found:
            raise metadata.PackageNotFoundError(name)
        return type("D", (), {"version": found[name], "read_text": lambda self, f: None,
                              "locate_file": lambda self, f: "/elsewhere/site-packages"})()
    monkeypatch.setattr(metadata, "distribution", distribution)
    line = check_import_clash()
    assert "'dflash' 0.1.0 (the public reference drafter" in line and "pip uninstall dflash" in line
    del found["dflash"]
    assert check_import_clash() is None


def test_every_app_keeps_its_files_where_the_dirs_group_says(monkeypatch, tmp_path):
    """dirs.cache: $DFLASH_CACHE, else .cache/dflash; the data cache and the recipe's
    workdir follow it, and a run dir lives under dirs.outputs."""
    from dflash.config import compose
    from dflash.dirs import cache_root
    monkeypatch.delenv("DFLASH_CACHE", raising=False)
    assert compose("train").data.cache_dir == ".cache/dflash" == str(cache_root())
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    assert compose("train").data.cache_dir == str(tmp_path) == str(cache_root())
    e2e = compose("end_to_end", ["dirs.cache=/scratch/d"])
    assert e2e.workdir == "/scratch/d/end_to_end/smollm2" and e2e.cache_dir == "/scratch/d"
    from hydra import compose as hydra_compose, initialize_config_dir
    from dflash.config import CONF_DIR
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("plan", ["dirs.outputs=/runs"], return_hydra_config=True)
        assert cfg.hydra.run.dir.startswith("/runs/")


@pytest.mark.parametrize("override, named", [
    ("optim.lr=-1", "optim.lr=-1.0: must be > 0"),  # (torch's own ValueError before)
    ("optim.warmup_ratio=2", "optim.warmup_ratio=2.0: must be in [0, 1]"),
    ("optim.beta2=1", "optim.beta2=1.0"),
    ("model.drafter.block_size=1", "model.drafter.block_size=1: must be >= 2"),  # (trained at loss 0)
    ("model.drafter.num_layers=0", "model.drafter.num_layers=0: must be >= 1"),  # (trained no layer)
    ("model.drafter.num_anchors=0", "model.drafter.num_anchors=0"),  # (a reshape error in torch)
    ("logger.log_every=0", "logger.log_every=0"),
    ("loss.gamma=0", "loss.gamma=0.0: must be > 0"),  # (NaN at step 1)
    ("eval.num_prompts=0", "eval.num_prompts=0"),  # (an eval of no prompt)
    ("loss.dspark_weights=[0.1,0.9]", "loss.dspark_weights=[0.1, 0.9]: must be three"),  # (step 1)
    ("loss.dspark_weights=[0,0,0]", "loss.dspark_weights=[0.0, 0.0, 0.0]"),  # (trained nothing)
])
def test_a_setting_that_cannot_work_is_refused_before_the_target_or_data_load(
        tmp_path, override, named):
    """No target or data exists here: only the setting's own refusal can be raised."""
    from dflash.errors import ConfigError
    from dflash.trainer import Trainer
    cfg = compose("train", ["model=hf", f"model.target.path={tmp_path}/none", "data=tokenized",
                            f"data.path={tmp_path}/none", override])
    with pytest.raises(ConfigError, match=f"^{re.escape(named)}"):
        Trainer(cfg, tmp_path).build()


def test_anchor_first_blocks_may_be_one_token():
    """sample_from_anchor: slot 0 drafts anchor + 1, so a block of 1 still drafts."""
    from dflash.model.config import check_drafter_config
    check_drafter_config(compose("train", ["model.drafter.block_size=1",
                                           "model.drafter.sample_from_anchor=true"]).model.drafter)


@pytest.mark.parametrize("app", ["train", "plan", "profile"])
def test_an_experiment_that_is_not_one_is_refused_not_skipped(app):
    """A typo of a recipe's name must not train the CPU defaults on an 8-GPU node."""
    from hydra.errors import MissingConfigException
    with pytest.raises(MissingConfigException, match="Could not find 'experiment/prodution'"):
        compose(app, ["experiment=prodution"])
