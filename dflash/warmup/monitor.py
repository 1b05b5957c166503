"""Counts compiles during training and names the shape that caused each.

After warmup nothing should compile: a new dynamo graph (a compile or a recompile), an
inductor compile (a graph lowered, or loaded from its cache) or a Triton autotune run
mid-training costs seconds on every rank, and on 8 GPUs lets ranks fall out of step.
The monitor reads the compilers' own counters after every step (host dict reads, no
device sync), so whatever compiled is attributed to the step and shape that ran.
"""
from __future__ import annotations

import logging

from dflash.errors import ConfigError, DataError

log = logging.getLogger("dflash.compile")


def _counts(autotuners: list) -> dict:
    from torch._dynamo.utils import counters
    ind = counters["inductor"]
    return {"dynamo_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "inductor_compiles": int(ind.get("fxgraph_cache_miss", 0) + ind.get("fxgraph_cache_hit", 0)
                                     + ind.get("fxgraph_cache_bypass", 0)),
            "autotune_runs": sum(len(getattr(a, "cache", {})) for a in autotuners)}


ON_COMPILE = ("warn", "stop")


class CompileError(DataError):
    """A compile after warmup with `warmup.on_compile=stop`: the message names the fix."""


class CompileMonitor:
    """`start()` after warmup; `check(step, shape)` after each step."""

    def __init__(self, on_compile: str = "warn", autotuners=lambda: []):
        """`autotuners`: returns the autotuned kernels loaded so far (a kernel module may
        first load mid-training, and its first tuning must still be seen)."""
        if on_compile not in ON_COMPILE:
            raise ConfigError(f"warmup.on_compile must be 'warn' or 'stop', got {on_compile!r}")
        self.on_compile = on_compile
        self.autotuners = autotuners
        self.events: list[dict] = []
        self._last = None

    def start(self) -> None:
        self._last = _counts(self.autotuners())

    def check(self, step: int, shape) -> None:
        now = _counts(self.autotuners())
        new = {k: now[k] - self._last[k] for k in now if now[k] > self._last[k]}
        self._last = now
        if not new:
            return
        shape_l = shape.as_list() if hasattr(shape, "as_list") else list(shape)
        event = {"step": int(step), "shape": shape_l, **new}
        self.events.append(event)
        msg = (f"step {step}: {', '.join(f'{v} {k}' for k, v in new.items())} for shape "
               f"[batch {shape_l[0]}, length {shape_l[1]}, anchors {shape_l[2]}] after warmup")
        if self.on_compile == "stop":
            raise CompileError(msg + " (warmup.on_compile=stop; warm this shape: "
                               "warmup.policy=all or a larger warmup.top_k / coverage)")
        log.warning(msg)

    @property
    def total(self) -> int:
        return sum(v for e in self.events for k, v in e.items() if k not in ("step", "shape"))

    def report(self) -> dict:
        return {"compiles_after_warmup": self.total, "compile_events": self.events[:100]}


def loaded_autotuners() -> list:
    """Autotuned kernels already loaded (importing Triton just to count them is waste)."""
    import sys
    mod = sys.modules.get("dflash.kernels.ce_triton")
    return mod.autotuners() if mod is not None else []
