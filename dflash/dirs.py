"""Where dflash keeps its files, named once: the `dirs` config group (what
lightning-hydra-template calls `paths`; here `paths=` is already the eval app's and the
recipe's key for the walk along held-out replies).

    dirs.cache    data sets, fitted world targets, compile caches, converted models, the
                  real-model recipe's workdir: $DFLASH_CACHE, else .cache/dflash
    dirs.outputs  every app's run and sweep dirs (conf/hydra/output/dflash.yaml)

Every app composes `dirs: default`; override a key (`dirs.cache=/scratch/dflash`) or
set $DFLASH_CACHE. Code outside a composed config calls `cache_root()`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "DFLASH_CACHE"
DEFAULT_CACHE = ".cache/dflash"


def cache_root() -> Path:
    """The cache dir: $DFLASH_CACHE, else .cache/dflash (relative to where an app runs)."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


@dataclass
class DirsConfig:
    cache: str = "${dflash_cache:}"  # $DFLASH_CACHE, else .cache/dflash
    outputs: str = "outputs"  # run and sweep dirs: <outputs>/<app>/DATE/TIME
