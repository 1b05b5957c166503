"""The machines a command will run on: nodes x GPUs a node x GPU memory (`4x8x80`),
or `cpu`; and the environment torchrun gives each process there."""
from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

from dflash.errors import ConfigError

# kept free of the stated memory: CUDA context, NCCL buffers, allocator rounding and
# fragmentation, which a fake-tensor measurement does not see
HEADROOM = 0.10


@dataclass(frozen=True)
class World:
    nodes: int = 1
    gpus_per_node: int = 0  # 0: a CPU machine
    gpu_gib: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "World":
        text = str(text).strip().lower()
        if text == "cpu":
            return cls()
        m = re.fullmatch(r"(\d+)\s*x\s*(\d+)\s*x\s*(\d+(?:\.\d+)?)\s*(?:gb|gib|g)?", text)
        if not m:
            raise ConfigError(f"--world {text!r}: write NODESxGPUSxGIB (e.g. 1x8x80, 4x8x80) "
                              "or cpu")
        nodes, gpus, mem = int(m[1]), int(m[2]), float(m[3])
        if nodes < 1 or gpus < 1 or mem <= 0:
            raise ConfigError(f"--world {text!r}: nodes, GPUs and memory must be positive")
        return cls(nodes, gpus, mem)

    @property
    def has_gpu(self) -> bool:
        return self.gpus_per_node > 0

    @property
    def usable_gib(self) -> float:
        return self.gpu_gib * (1 - HEADROOM)

    def __str__(self) -> str:
        if not self.has_gpu:
            return "cpu"
        return f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.gpus_per_node} GPUs x {self.gpu_gib:g} GiB"


@contextlib.contextmanager
def launched(nproc_per_node: int, nnodes: int, env: dict | None = None):
    """The environment rank 0 of the command sees (torchrun's variables, the command's
    own VAR=value), put back afterwards."""
    world = nproc_per_node * nnodes
    new = {**(env or {})}
    if world > 1 or nproc_per_node > 1:
        new.update(WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0",
                   LOCAL_WORLD_SIZE=str(nproc_per_node))
    drop = [k for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE") if k not in new]
    saved = {k: os.environ.get(k) for k in [*new, *drop]}
    os.environ.update(new)
    for k in drop:
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
