"""The warm run: every kernel compiled and tuned for every planned shape before step 1.

For each shape of the closed set (`dflash.warmup.shapes`), largest first so the allocator
reserves peak memory up front, the run does what a training step does except the
update: target forward, drafter forward and backward, the fused LM-head loss (whose
Triton autotuner picks its config on first call per vocabulary size). Weights,
optimizer state and the training RNG streams are untouched, so a run with warmup
trains exactly like one without.

Compile and autotune results persist under `<data.cache_dir>/compile` (the inductor
cache and Triton's on-disk cache), so later runs and other ranks reuse them: rank 0
warms first, the others wait at a barrier and then warm from the caches.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

log = logging.getLogger("dflash.warmup.run")




def use_compile_caches(cache_dir: str | Path) -> Path:
    """Point inductor and Triton at shared on-disk caches (before anything compiles)."""
    root = Path(cache_dir) / "compile"
    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    try:  # Triton reads its knobs lazily; set them too in case it was already imported
        import triton.knobs as knobs
        knobs.cache.dir = os.environ["TRITON_CACHE_DIR"]
    except (ImportError, AttributeError):
        pass
    return root


def configure_compile(mode: str, num_shapes: int) -> None:
    """Static compiles specialise per shape: allow one graph per planned shape and fail
    loudly instead of the silent eager fallback past the limit (a dense score matrix)."""
    import torch._dynamo.config as dc
    limit = max(8, int(num_shapes) + 8)
    dc.recompile_limit = max(dc.recompile_limit, limit)
    dc.accumulated_recompile_limit = max(dc.accumulated_recompile_limit, 4 * limit)
    dc.fail_on_recompile_limit_hit = mode != "off"


def dummy_batch(shape, vocab_size: int, device, seed: int = 0, packed: bool = False,
                doc_len: int = 0):
    """A full batch of the given shape: every position real and supervised, so every
    anchor slot is valid and the loss covers every row (the largest work of the shape).
    Packed runs warm with position ids too (one document per row: the most work), so
    the warmed code path is the one training takes."""
    from dflash.step import DeviceBatch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (shape.batch_size, shape.seq_len), generator=g)
    ones = torch.ones_like(ids, dtype=torch.bool)
    # doc_len > 0 (the profile): documents of that length, as real packed rows hold them
    span = torch.arange(shape.seq_len) % doc_len if doc_len > 0 else torch.arange(shape.seq_len)
    pos = span.expand_as(ids).contiguous().to(device) if packed else None
    return DeviceBatch(None, ids.to(device), ones.to(device), ones.to(device), shape, pos)


def warm(step, shapes, vocab_size: int, drafter_device, progress: bool = False,
         packed: bool = False) -> dict:
    """Run every shape once through the real step (no update); returns timings."""
    from tqdm.auto import tqdm

    t0, per_shape = time.perf_counter(), []
    for shape in tqdm(shapes, desc="warmup", unit="shape", disable=not progress):
        t = time.perf_counter()
        b = dummy_batch(shape, vocab_size, step.target_device, packed=packed)
        ctx = step.context(b).to(drafter_device, non_blocking=True)
        step.warm_step(b, ctx)
        if drafter_device.type == "cuda":
            torch.cuda.synchronize(drafter_device)
        per_shape.append({"shape": shape.as_list(), "seconds": round(time.perf_counter() - t, 3)})
    out = {"seconds": time.perf_counter() - t0, "per_shape": per_shape}
    if drafter_device.type == "cuda":
        out["peak_memory_mb"] = torch.cuda.max_memory_reserved(drafter_device) / 2**20
    return out


def warm_ranks(topo, fn) -> dict:
    """Rank 0 compiles and tunes first; the others then read its caches. Under
    topology.target_tp every rank warms at once: a sharded target's forward is a
    collective of its TP group, so a rank warming alone would wait on its peers forever."""
    if not topo.distributed or topo.tp_size > 1:
        return fn()
    import torch.distributed as dist
    if topo.rank == 0:
        out = fn()
        dist.barrier()
    else:
        dist.barrier()
        out = fn()
    return out


def warm_run(step, shapes, topo, progress: bool = False, packed: bool = False) -> dict:
    """Every warm shape of a run through its real step, rank 0 first (it fills the caches)."""
    if not shapes:
        return {"seconds": 0.0, "per_shape": []}
    vocab = int(step.target.vocab_size)
    return warm_ranks(topo, lambda: warm(step, shapes, vocab, topo.drafter_device,
                                         progress=progress and topo.is_main, packed=packed))
