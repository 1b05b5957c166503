"""A documented command line, read as the launcher would: which app, its overrides, and
how many processes on how many nodes it starts.

    torchrun --nnodes=4 --nproc_per_node=8 -m dflash.train experiment=production ...
    python -m dflash.regenerate inputs=[p.jsonl] out=r.jsonl model.target.path=DIR
    make train ARGS="batching=random"
    VAR=value python -m dflash.eval drafter=DIR ...
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from dflash.errors import ConfigError

# `make` targets that run an app, and the app's extra arguments
MAKE_APPS = {"train": ("dflash.train", []), "train-real": ("dflash.end_to_end", []),
             "train-real-llama": ("dflash.end_to_end", [])}
APPS = ("dflash.train", "dflash.regenerate", "dflash.eval", "dflash.plan", "dflash.profile",
        "dflash.end_to_end", "dflash.data.prepare", "dflash.buckets", "dflash.preflight",
        # command-line tools (argparse): their arguments are checked, nothing composes
        "dflash.recipe.engine_speed", "dflash.model.draft_head")


AUTO = 0  # torchrun --nproc_per_node=auto|gpu: one process a GPU of the world's nodes


@dataclass
class Command:
    module: str  # dflash.train, ...
    args: list = field(default_factory=list)  # the app's own arguments (overrides)
    nproc_per_node: int = 1
    nnodes: int = 1
    env: dict = field(default_factory=dict)  # VAR=value before the command
    text: str = ""

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def overrides(self) -> list:
        """Hydra overrides (key=value, group=option, ~key; --multirun dropped)."""
        return [a for a in self.args if ("=" in a or a.startswith("~")) and not a.startswith("-")]

    @property
    def multirun(self) -> bool:
        return any(a in ("-m", "--multirun") for a in self.args)


def _int_opt(tokens: list, i: int, name: str) -> tuple[int | None, int]:
    """(value, tokens consumed) of `--name=V` or `--name V` at tokens[i], else (None, 0);
    torchrun spells options with _ or -."""
    tok = tokens[i]
    for spelling in (f"--{name}", f"--{name.replace('_', '-')}"):
        if tok.startswith(spelling + "="):
            return _count(tok.split("=", 1)[1], spelling), 1
        if tok == spelling and i + 1 < len(tokens):
            return _count(tokens[i + 1], spelling), 2
    return None, 0


def _count(v: str, flag: str) -> int:
    """torchrun's count: N, MIN:MAX (elastic: the most), or for processes a node `auto` /
    `gpu` (one a GPU: AUTO, resolved against the world)."""
    if flag.startswith("--nproc") and v in ("auto", "gpu"):
        return AUTO
    try:
        return int(v.split(":")[-1])
    except ValueError:
        want = "a number, auto or gpu" if flag.startswith("--nproc") else "a number or MIN:MAX"
        raise ConfigError(f"torchrun {flag}={v}: give {want}") from None


def parse(text: str) -> Command:
    """The command `text` (one shell line; backslash-newlines allowed) as a Command."""
    tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    env = {}
    while tokens and "=" in tokens[0] and not tokens[0].startswith("-") \
            and tokens[0].split("=", 1)[0].isidentifier():
        k, v = tokens.pop(0).split("=", 1)
        env[k] = v
    if not tokens:
        raise ConfigError(f"no command in {text!r}")
    head = tokens[0].rsplit("/", 1)[-1]
    cmd = Command("", env=env, text=text.strip())
    if head == "make":
        target = next((t for t in tokens[1:] if "=" not in t and not t.startswith("-")), None)
        if target not in MAKE_APPS:
            raise ConfigError(f"make {target}: not a target that runs a dflash app")
        cmd.module, extra = MAKE_APPS[target]
        args = next((t.split("=", 1)[1] for t in tokens[1:] if t.startswith("ARGS=")), "")
        cmd.args = [*extra, *shlex.split(args)]
        return cmd
    i = 1
    if head == "torchrun":
        while i < len(tokens) and tokens[i] != "-m" and tokens[i].startswith("-"):
            for name, attr in (("nproc_per_node", "nproc_per_node"), ("nnodes", "nnodes")):
                value, used = _int_opt(tokens, i, name)
                if used:
                    setattr(cmd, attr, value)
                    i += used
                    break
            else:  # another torchrun option (with its value when it takes one)
                i += 1 if "=" in tokens[i] or tokens[i] in ("--standalone",) else 2
    elif not head.startswith("python"):
        raise ConfigError(f"{head}: not a python, torchrun or make command")
    if i >= len(tokens) or tokens[i] != "-m" or i + 1 >= len(tokens):
        raise ConfigError(f"{text.strip()!r}: expected `-m dflash.<app>`")
    cmd.module = tokens[i + 1]
    if cmd.module not in APPS:
        raise ConfigError(f"{cmd.module}: not one of dflash's apps ({', '.join(APPS)})")
    cmd.args = tokens[i + 2:]
    _submitit_world(cmd)
    return cmd


def _submitit_world(cmd: Command) -> None:
    """Under Hydra's submitit launcher every SLURM task is one process: nodes x
    tasks_per_node of them, as torchrun's would be."""
    if "hydra/launcher=submitit_slurm" not in cmd.args:
        return
    for arg in cmd.args:
        key, _, value = arg.partition("=")
        if key == "hydra.launcher.nodes":
            cmd.nnodes = int(value)
        elif key == "hydra.launcher.tasks_per_node":
            cmd.nproc_per_node = int(value)
