"""Composing a config, building a trainer and running an app, as every test does them."""
from __future__ import annotations

import subprocess
import sys

from dflash.config import compose
from tests.helpers.paths import REPO

# one small world for the whole session: its target is fitted once, then cached
WORLD = ["data.num_samples=400", "data.target_fit_steps=350", "eval.num_prompts=6",
         "eval.max_new_tokens=32"]
# a trainer that only trains: no progress bar, no evaluation
QUIET = ["logger.progress=false", "eval.enabled=false"]


def train_config(cache, *overrides):
    """The train app's config on the shared small world."""
    return compose("train", [*WORLD, f"data.cache_dir={cache}", *overrides])


def build_trainer(cache, out, *overrides):
    from dflash.trainer import Trainer
    return Trainer(train_config(cache, *overrides), out).build()


def run_module(module, *args, check=True, timeout=300):
    """`python -m module args...` in the repository, as a user would run it."""
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stdout + proc.stderr)
    return proc
