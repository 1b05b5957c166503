"""Settings that used to fail with a traceback after work was done now fail at start,
in one line naming what to change."""

import pytest

from dflash.batching.distributed import _dealt
from dflash.errors import ConfigError
from dflash.model.masks import check_flex_block_size


def test_a_block_size_that_straddles_flex_tiles_is_refused_at_start():
    check_flex_block_size(16)
    with pytest.raises(ConfigError, match=r"model.drafter.block_size=12 does not divide flex "
                                          r"attention's tile of 128 .*model.attention=sdpa"):
        check_flex_block_size(12)


def test_an_epoch_with_no_batches_names_the_likely_settings():
    with pytest.raises(ConfigError, match="no sample is left to train on .*data.overlong=drop"):
        _dealt(0, 2, "repeat")


def test_prompt_generation_that_runs_out_is_one_line(tmp_path, monkeypatch, capsys):
    from dflash.recipe import prompt_gen
    monkeypatch.setattr(prompt_gen, "_draw", lambda kind, rng, pools: ("the same prompt", None))
    with pytest.raises(SystemExit) as e:
        prompt_gen.main(["--n", "2", "--out", str(tmp_path / "p.jsonl")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert "no new prompt after 10,000 draws at prompt 1 of 2" in err
    assert not (tmp_path / "p.jsonl").exists()  # nothing half-written


def test_ctrl_c_in_an_app_is_one_line_and_the_shells_status(capsys):
    """An app that does not stop on Ctrl-C itself (regenerate, eval, prepare; training's
    second press) ends with one line and status 130, not a KeyboardInterrupt traceback."""
    from dflash.errors import user_errors_exit

    @user_errors_exit
    def app():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as ended:
        app()
    assert ended.value.code == 130
    assert capsys.readouterr().err.strip() == (
        "dflash: test_start_errors interrupted (Ctrl-C); what it wrote before is kept")


def test_a_cache_dir_that_cannot_be_one_is_refused_before_training_builds(tmp_path):
    """data.cache_dir under a file failed with NotADirectoryError when warmup made its
    compile cache (after the data); nothing is created by the check (preflight runs it)."""
    from dflash.config import compose
    from dflash.trainer import check_settings
    (tmp_path / "f").write_text("")
    for where, named in [(tmp_path / "f", "a file, not a directory"),
                         (tmp_path / "f" / "c", f"{tmp_path / 'f'} is a file, not a directory")]:
        with pytest.raises(ConfigError, match=rf"data.cache_dir={where}: {named}"):
            check_settings(compose("train", [f"data.cache_dir={where}"]))
    check_settings(compose("train", [f"data.cache_dir={tmp_path / 'new' / 'cache'}"]))
    assert not (tmp_path / "new").exists()


def test_a_run_dir_under_a_file_is_one_line_before_hydra_makes_it(tmp_path, capsys, monkeypatch):
    """Hydra makes the run (or sweep) dir before the app starts: under a file it was a
    NotADirectoryError traceback."""
    import sys
    from dflash.errors import hydra_dirs_checked
    (tmp_path / "f").write_text("")
    ran = []
    app = hydra_dirs_checked(lambda: ran.append(1))
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        monkeypatch.setattr(sys, "argv", ["dflash.train", "-m", f"{key}={tmp_path / 'f' / 'r'}"])
        with pytest.raises(SystemExit) as ended:
            app()
        assert ended.value.code == 2 and not ran
        assert capsys.readouterr().err.strip() == (
            f"dflash: error: {key}={tmp_path / 'f' / 'r'}: {tmp_path / 'f'} is a file, not a directory")
    monkeypatch.setattr(sys, "argv", ["dflash.train", f"hydra.run.dir={tmp_path / 'r'}"])
    app()
    assert ran == [1]


def test_a_value_the_environment_fills_wrongly_is_one_line(capsys, monkeypatch):
    """logger=wandb's mode is ${oc.env:WANDB_MODE,offline}: a value the schema refuses
    surfaced as an InterpolationValidationError traceback where the app first read it."""
    from dflash.config import compose
    from dflash.errors import user_errors_exit
    monkeypatch.setenv("WANDB_MODE", "bogus")
    cfg = compose("train", ["logger=wandb"])
    with pytest.raises(SystemExit) as ended:
        user_errors_exit(lambda: cfg.logger.mode)()
    line = capsys.readouterr().err.strip()
    assert ended.value.code == 2 and "\n" not in line
    assert line.startswith("dflash: error: While dereferencing interpolation "
                           "'${oc.env:WANDB_MODE,offline}': Invalid value 'bogus'")
    assert "full_key: logger.mode" in line


def test_a_value_our_resolver_refuses_is_its_own_line(tmp_path, capsys):
    """The drafter's depth is derived from the target's config.json by a resolver: a
    target path without one is the resolver's own line, not OmegaConf's wrapping of it."""
    from dflash.config import compose
    from dflash.errors import user_errors_exit
    cfg = compose("train", ["experiment=production", "data.path=d",
                            f"model.target.path={tmp_path}"])
    with pytest.raises(SystemExit) as ended:
        user_errors_exit(lambda: cfg.model.drafter.num_layers)()
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"dflash: error: model.target.path={tmp_path}: no config.json there (expected a "
        "local HF model directory)")
