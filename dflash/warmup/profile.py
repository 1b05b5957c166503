"""Timing the real training step at a set of shapes, for the step cost model.

The warm run already executes every planned shape once; the profile runs each through
the whole step a training step takes (target context, drafter forward and backward,
fused loss, optimizer update), once to warm and `reps` more timed, on the configured
devices and dtypes. Shapes: the run's warm set (what training will meet) spread over
its sizes, plus variants with fewer anchor slots and fewer rows, so the fit can tell
per-anchor from per-row from per-token costs.
"""
from __future__ import annotations

import os
import platform
import time

import numpy as np
import torch

from dflash.batching.step_cost import load_cost_file
from dflash.batching.strategies import traits
from dflash.model.target import target_sizes
from dflash.options import choice
from dflash.warmup.run import dummy_batch
from dflash.warmup.shapes import Shape


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {platform.machine()} x{os.cpu_count()} threads={torch.get_num_threads()}"


def model_identity(cfg) -> dict:
    """The model half of a cost file's identity (step_cost.MODEL_FIELDS), from the
    config alone: what a plan made away from the GPUs can still check."""
    sizes = target_sizes(cfg.model.target)
    return {"target_dtype": str(cfg.model.target.dtype),
            "target_hidden_size": sizes["hidden_size"], "target_num_layers": sizes["num_layers"],
            "vocab_size": sizes["vocab_size"],
            "drafter_num_layers": int(cfg.model.drafter.num_layers),
            "block_size": int(cfg.model.drafter.block_size),
            "compile": choice(cfg.model.compile),
            # packed rows take another code path (documents in a row): their own file
            "step_kind": "packed" if traits(choice(cfg.batching.strategy)).packs_rows else "padded",
            # a target sharded over k ranks runs its stage at another cost (collectives)
            "target_tp": int(cfg.topology.get("target_tp", 1))}


def run_identity(cfg, device: torch.device) -> dict:
    """What a cost file is only valid for: hardware, dtypes, model sizes, compile mode."""
    autocast = choice(cfg.model.autocast)
    if autocast == "auto":
        autocast = "bf16" if device.type == "cuda" else "off"
    autocast = {"bfloat16": "bf16"}.get(autocast, autocast)  # one identity per dtype
    return {"device": device_name(device), "device_count": int(cfg.topology.dp_size),
            "autocast": autocast, **model_identity(cfg), "torch": torch.__version__}


def step_pricer(cfg, device: torch.device):
    """`cost=FILE`: the predicted seconds of each step as the run takes them, from a step
    cost file measured on this hardware and model (refused otherwise, naming the
    differing field); None without `cost`."""
    if not cfg.get("cost"):
        return None
    model, _ = load_cost_file(cfg.cost, run_identity(cfg, device))
    return model.pricer(str(cfg.cost))


def profile_shapes(warm: list, token_budget: int, max_rows: int, max_shapes: int = 24,
                   grid: int = 6) -> list:
    """Shapes to time: up to `max_shapes` of the run's warm shapes spread evenly over
    their sizes (the largest by tokens, length and rows always among them, so every warm
    shape lies inside the profiled range); the budget's envelope at `grid` lengths (full
    and half-full batches: the shapes other strategies under the same budget meet); and
    for every third shape a variant with half the anchor slots, so the fit can tell
    per-anchor from per-row cost."""
    warm = sorted(set(warm), key=lambda s: (s.tokens, s.seq_len))
    idx = set(np.linspace(0, len(warm) - 1, min(len(warm), max_shapes)).round().astype(int).tolist())
    pick = [warm[i] for i in sorted(idx)]
    for key in (lambda s: s.seq_len, lambda s: s.batch_size, lambda s: s.tokens):
        pick.append(max(warm, key=key))
    anchors = max(s.anchors for s in warm)
    lo, hi = min(s.seq_len for s in warm), max(s.seq_len for s in warm)
    step = max(1, min(s.seq_len for s in warm))  # lengths stay on the run's rounding grid
    for L in np.unique(np.geomspace(lo, hi, grid).round().astype(int)):
        L = int(-(-L // step) * step) if step > 1 and L % step else int(L)
        L = min(L, hi)
        rows = max(1, min(int(max_rows), int(token_budget) // L))
        pick += [Shape(rows, L, anchors), Shape(max(1, rows // 2), L, anchors)]
    pick = list(dict.fromkeys(pick))
    if len({s.seq_len for s in pick}) < 3:  # packed rows (one length): vary every dimension
        pick += [Shape(max(1, b), max(1, L), max(1, a)) for s in list(pick)
                 for b in {1, s.batch_size // 2, s.batch_size}
                 for L in {s.seq_len // 2, s.seq_len} for a in {s.anchors // 4, s.anchors}]
        pick = list(dict.fromkeys(pick))
    extra = [Shape(s.batch_size, s.seq_len, max(1, s.anchors // 2)) for s in pick[::3] if s.anchors > 1]
    return list(dict.fromkeys(pick + extra))


def time_shapes(step, shapes, vocab_size: int, drafter_device, reps: int = 3,
                packed: bool = False, progress: bool = False, doc_len: int = 0) -> list[dict]:
    """Per shape, the median seconds of the whole step run twice in a row: the first
    call follows another shape (`switch_seconds`: kernels, caches and allocator blocks
    change shape), the second repeats it (`seconds`). A plan that keeps its shape from
    step to step (sorted) pays the second, one that changes it every step (random) the
    first. One untimed round first, then `reps` rounds over all shapes in turn, so a
    machine that drifts moves every shape alike."""
    from tqdm.auto import tqdm
    cuda = drafter_device.type == "cuda"
    batches = [dummy_batch(s, vocab_size, step.target_device, packed=packed, doc_len=doc_len)
               for s in shapes]
    first, again = [[] for _ in shapes], [[] for _ in shapes]

    def timed(b) -> float:
        if cuda:
            torch.cuda.synchronize(drafter_device)
        t = time.perf_counter()
        step(b)
        if cuda:
            torch.cuda.synchronize(drafter_device)
        return time.perf_counter() - t

    bar = tqdm(total=(reps + 1) * len(shapes), desc="profile", unit="shape", disable=not progress)
    for rnd in range(reps + 1):
        for i, b in enumerate(batches):
            t1, t2 = timed(b), timed(b)
            if rnd:
                first[i].append(t1)
                again[i].append(t2)
            bar.update(1)
    bar.close()
    return [{"rows": s.batch_size, "seq_len": s.seq_len, "anchors": s.anchors,
             "seconds": float(np.median(t2)), "switch_seconds": float(np.median(t1)),
             "spread": float(np.max(t2) - np.min(t2))}
            for s, t1, t2 in zip(shapes, first, again)]
