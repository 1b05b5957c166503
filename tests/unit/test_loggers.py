"""W&B at a run's start: missing credentials and a run W&B cannot start are one line,
before the target loads, not a traceback when the first record is due."""
from types import SimpleNamespace

import pytest

from dflash.errors import ConfigError
from dflash.loggers import WandbLogger, check_wandb_login


def _cfg(mode="online", name="wandb"):
    return SimpleNamespace(name=name, mode=mode, project="dflash", group=None, run_name=None,
                           get=lambda k, d=None: None)


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    """A machine where nobody logged in to W&B (no key, no netrc, no settings)."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    # W&B greets a found key with the account's name, asked of its server (5 s to time
    # out on a machine without the internet); silent, it does not ask
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb
    wandb.teardown()  # W&B reads its environment once a process: read this one
    yield tmp_path
    wandb.teardown()


def test_online_wandb_without_a_key_is_refused_at_start_and_with_one_it_goes_on(
        no_credentials, monkeypatch):
    with pytest.raises(ConfigError, match="no W&B API key here; run `wandb login`"):
        check_wandb_login(_cfg())
    for mode, name in (("offline", "wandb"), ("disabled", "wandb"), ("online", "none")):
        check_wandb_login(_cfg(mode, name))  # nothing to log in to
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    check_wandb_login(_cfg())  # found, not verified (no network at start)


def test_a_run_wandb_cannot_start_is_one_line(no_credentials, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "bogus")  # W&B's own setting, read at init
    with pytest.raises(ConfigError) as refused:
        WandbLogger(_cfg("offline"), no_credentials, {})
    line = str(refused.value)
    assert line.startswith("logger=wandb logger.mode=offline: W&B could not start a run")
    assert "bogus" in line and "\n" not in line and "wandb login" not in line
