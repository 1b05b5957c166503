"""Each stage's app config, composed and checked before the first stage runs.

The recipe's `regenerate`, `train` and `eval` sections hold their app's own keys, nested
as in its config, and under `groups` its config group choices:

    train: {groups: {loss: dpace}, loss: {draft_vocab: 4096}, epochs: 12}
        -> loss=dpace loss.draft_vocab=4096 epochs=12

(`train.groups.loss=ce` chooses another loss; the recipe's `loss.draft_vocab` still
applies). Every stage's overrides compose against its app's schema at start: a misspelled
key or a wrong type fails in one line naming the stage, before any stage ran.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from dflash import config
from dflash.errors import ConfigError, UserError
from dflash.recipe.workdir import Workdir


def overrides(section) -> list[str]:
    """A stage section -> its app's command-line overrides: the group choices, then the
    keys (a.b.c=value)."""
    keys = OmegaConf.to_container(section, resolve=True) if OmegaConf.is_config(section) \
        else dict(section)
    groups = keys.pop("groups", None) or {}
    return [f"{g}={choice}" for g, choice in groups.items()] + _flat(keys)


def _flat(keys: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in keys.items():
        if isinstance(v, dict):
            out += _flat(v, f"{prefix}{k}.")
        else:
            text = json.dumps(v) if isinstance(v, (bool, list)) or v is None else str(v)
            out.append(f"{prefix}{k}={text}")
    return out


def compose_app(app: str, keys: list):
    """`app`'s config for `keys`, inside this app (Hydra initialised) or outside it."""
    from hydra import compose as hydra_compose
    from hydra.core.global_hydra import GlobalHydra
    if GlobalHydra.instance().is_initialized():  # inside the recipe: its conf dir is dflash's
        return hydra_compose(app, list(keys))
    return config.compose(app, keys)


def checked(stage: str, app: str, keys: list, settings=None) -> DictConfig:
    """`app`'s config for `keys`, with the app's own start check `settings(cfg)` of its
    values, or one line naming the stage and what is wrong."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    try:
        cfg = compose_app(app, keys)
        if settings is not None:
            settings(cfg)
        return cfg
    except (HydraException, OmegaConfBaseException, UserError) as exc:
        why = str(exc).strip().splitlines()[0]
        raise ConfigError(f"stage {stage} (python -m dflash.{app}): {why}") from None


def train_digest(cfg: DictConfig, data: str = "") -> str:
    """A digest of the composed training config, defaults included: a dflash whose
    defaults changed (a group preset, a schema default) trains afresh on a rerun rather
    than skipping to the drafter the old defaults trained."""
    return hashlib.sha1((OmegaConf.to_yaml(cfg) + data).encode()).hexdigest()[:8]


@dataclass
class StageConfigs:
    """Every app stage's overrides, and the composed configs the recipe reads."""
    model: list  # model=hf model.target.path=... (every stage's target)
    regenerate: list  # the recipe's regenerate keys (both regenerate stages)
    train_keys: list  # the recipe's train keys (the estimate's probe trains with them)
    train: list  # the train stage's overrides, but its run dir
    eval: list  # the eval stage's own keys
    train_cfg: DictConfig
    regenerate_cfg: DictConfig

    @classmethod
    def build(cls, cfg, target: Path, work: Workdir) -> "StageConfigs":
        """Composed and checked before the first stage: a typo fails here."""
        model = ["model=hf", f"model.target.path={target}"]
        regen = overrides(cfg.regenerate)
        train_keys = overrides(cfg.train)
        train = [*model, "data=tokenized", f"data.path={work.data}", "eval.enabled=false",
                 *train_keys]
        ev = overrides(cfg.eval)
        from dflash.evaluate import check_settings as eval_settings
        from dflash.regenerate import check_settings as regen_settings
        from dflash.trainer import check_settings as train_settings
        regen_cfg = checked("regenerate", "regenerate", [
            *model, f"inputs=[{work.prompts}]", f"out={work.replies}", *regen], regen_settings)
        train_cfg = checked("train", "train", train, train_settings)
        checked("eval", "eval", [*model, f"prompts={work.heldout}", *ev], eval_settings)
        return cls(model, regen, train_keys, train, ev, train_cfg, regen_cfg)
