"""Composing a config, building a trainer and running an app, as every test does them."""
from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import signal
import subprocess
import sys

import pytest

from dflash.config import compose
from tests.helpers.paths import REPO

# one small world for the whole session: its target is fitted once, then cached
WORLD = ["data.num_samples=400", "data.target_fit_steps=250", "data.target_fit_batch=16",
         "eval.num_prompts=6",
         "eval.max_new_tokens=32"]
# a command's app module, where it is not the command's own module
APP_OF = {"dflash.eval": "dflash.evaluate"}
# a trainer that only trains: no progress bar, no evaluation
QUIET = ["logger.progress=false", "eval.enabled=false"]


def train_config(cache, *overrides):
    """The train app's config on the shared small world."""
    return compose("train", [*WORLD, f"data.cache_dir={cache}", *overrides])


def build_trainer(cache, out, *overrides):
    from dflash.trainer import Trainer
    return Trainer(train_config(cache, *overrides), out).build()


def run_module(module, *args, check=True, timeout=300, fresh=False):
    """`python -m module args...` as a user would run it. In this process by default: the
    app's own Hydra `main()` parses the same argv (a new interpreter costs ~4 s of
    imports a call); `fresh=True` starts one, for what only a process can show (its
    hardware identity, a wheel install, signals)."""
    if fresh:
        proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, text=True,
                              capture_output=True, timeout=timeout)
    else:
        proc = _in_process(module, list(args))
    if check and proc.returncode != 0:
        raise AssertionError(proc.stdout + proc.stderr)
    return proc


def _in_process(module: str, args: list) -> subprocess.CompletedProcess:
    """Run an app's `main()` with `args` as its command line; whatever a run changes in
    the process (environment, logging, signal handlers, threads, Hydra's singleton,
    dynamo's compiled graphs) is
    put back, so the next call starts as a new process would."""
    import torch
    from hydra.core.global_hydra import GlobalHydra

    # `python -m dflash.eval` forwards to the app module dflash.evaluate
    main = importlib.import_module(APP_OF.get(module, module)).main
    saved_env, saved_argv, cwd = dict(os.environ), sys.argv, os.getcwd()
    root = logging.getLogger()
    saved_log = (list(root.handlers), root.level)
    saved_sig = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
                                                  signal.SIGINT)}
    threads = torch.get_num_threads()
    out, err, code = io.StringIO(), io.StringIO(), 0
    GlobalHydra.instance().clear()
    torch._dynamo.reset()  # compiled graphs live in the process: start without any
    sys.argv = [module, *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        GlobalHydra.instance().clear()
        torch._dynamo.reset()
        sys.argv = saved_argv
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for h in set(root.handlers) - set(saved_log[0]):  # the run's log file, its console
            h.close()
        root.handlers[:] = saved_log[0]
        root.setLevel(saved_log[1])
        for s, h in saved_sig.items():
            signal.signal(s, h)
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess([module, *args], code, out.getvalue(), err.getvalue())


def torchrun_ok(proc) -> None:
    """A finished torchrun that must have succeeded. On failure, show what the ranks
    printed: torchrun's own traceback after it says only which rank died, by which signal."""
    if proc.returncode:
        ranks = proc.stderr.rpartition("Traceback (most recent call last):")[0] or proc.stderr
        pytest.fail(f"torchrun exited {proc.returncode}; the ranks' stderr ends:\n"
                    f"{ranks[-3000:]}", pytrace=False)
