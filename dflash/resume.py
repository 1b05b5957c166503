"""Training-state checkpoints: atomic writes, the newest valid one, exact resume.

A checkpoint is a directory `checkpoints/step-000123/` holding `state.pt` (drafter,
optimizer, scheduler, the anchor RNG, metrics so far) and `meta.json` (epoch, step,
position in the epoch, the plan hash, a sha256 of `state.pt`). It is written into a
temporary directory, fsynced, then renamed into place, so a process killed mid-write
leaves only a `.tmp-*` directory that is never read; a checkpoint whose hash does not
match is skipped with a warning. The plan hash covers every setting that decides which
batches come in which order, so a resume under a changed plan is refused unless forced.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dflash.errors import DataError
from dflash.model.checkpoint import EXPORT_DTYPES
from dflash.options import options

log = logging.getLogger("dflash.resume")

PLAN_KEYS = ("data", "batching", "buckets", "seed", "epochs", "topology.dp_size",
             "optim.max_steps", "optim.max_tokens", "model.drafter.num_anchors")


def plan_hash(cfg) -> str:
    """A digest of the config that decides the plan (and so the sample order)."""
    from omegaconf import OmegaConf
    parts = {}
    for k in PLAN_KEYS:
        v = OmegaConf.select(cfg, k)
        parts[k] = OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
    parts["data"].pop("cache_dir", None)  # where the cache lives does not change the plan
    parts["data"].pop("target_fit_batch", None)  # nor how the world's target was fitted
    # per-bucket caps came later: unset, they leave the hash of older checkpoints as it was
    if parts["buckets"].get("max_batch_size") is None:
        parts["buckets"].pop("max_batch_size", None)
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fault_pause() -> None:
    """Fault injection for the kill-during-write test: DFLASH_FAULT_CHECKPOINT_PAUSE=S
    holds every write for S seconds between the state file and the metadata."""
    pause = float(os.environ.get("DFLASH_FAULT_CHECKPOINT_PAUSE", 0) or 0)
    if pause > 0:
        import time
        time.sleep(pause)


def save(ckpt_dir: Path, step: int, state: dict, meta: dict, keep: int = 2) -> Path:
    """Write atomically; keep the newest `keep`. A full disk leaves the previous valid
    checkpoint in place and raises a DataError saying so."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step-{step:09d}"
    tmp = ckpt_dir / f".tmp-step-{step:09d}-{os.getpid()}"
    # only rank 0 writes, so any other temporary dir is a write a killed run left behind
    for stale in ckpt_dir.glob(".tmp-step-*"):
        shutil.rmtree(stale, ignore_errors=True)
    try:
        tmp.mkdir()
        with open(tmp / "state.pt", "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        _fault_pause()
        meta = {**meta, "step": step, "sha256": _sha256(tmp / "state.pt")}
        with open(tmp / "meta.json", "w") as f:
            json.dump(meta, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        _fsync_dir(ckpt_dir)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        prev = newest_valid(ckpt_dir)
        raise DataError(f"could not write checkpoint {final} ({exc.strerror or exc}); "
                        f"the previous one stays valid: {prev[0] if prev else 'none'}") from exc
    for old in sorted(ckpt_dir.glob("step-*"))[:-max(1, keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read(path: Path):
    """(meta, state) of one checkpoint dir, or raise DataError naming what is wrong."""
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"checkpoint {path}: meta.json missing or unreadable ({exc})") from exc
    state_file = path / "state.pt"
    if not state_file.exists() or _sha256(state_file) != meta.get("sha256"):
        raise DataError(f"checkpoint {path}: state.pt is missing or does not match its hash "
                        "(truncated or corrupt)")
    return meta, torch.load(state_file, map_location="cpu", weights_only=False)


def newest_valid(ckpt_dir: Path):
    """(path, meta, state) of the newest checkpoint that reads back whole, or None;
    partial or corrupt ones are skipped with a warning, never loaded."""
    for path in sorted(Path(ckpt_dir).glob("step-*"), reverse=True):
        try:
            meta, state = read(path)
        except DataError as exc:
            log.warning("skipping %s", exc)
            continue
        return path, meta, state
    return None


class Checkpointer:
    """The training side of checkpoints: what goes in, when a save is due, and resuming.

    It holds the objects whose state it saves (drafter, optimizer, schedule, the anchor
    RNG) and decides itself when to write: every `checkpoint.every_steps` steps, once
    `checkpoint.every_minutes` of wall clock passed since the last save, and on a
    preemption. `extra` is the trainer's own progress (a dict), saved beside them."""

    def __init__(self, out_dir, cfg, resume: str, plan_digest: str, topo, *, drafter,
                 optimizer, scheduler, generator, identity: dict | None = None,
                 verify=None):
        self.every, self.keep = int(cfg.every_steps), int(cfg.keep)
        self.seconds = 60.0 * float(cfg.get("every_minutes", 0) or 0)
        self.last_save = time.monotonic()
        self.dir = Path(out_dir) / "checkpoints"
        self.resume, self.force = str(resume), bool(cfg.force_resume)
        self.hash, self.topo = plan_digest, topo
        self.drafter, self.optimizer, self.scheduler = drafter, optimizer, scheduler
        self.generator = generator
        # the run's identity (dflash.run_identity), written into every checkpoint; `verify`
        # (meta, path) refuses a checkpoint of another run before its weights load
        self.identity, self.verify = identity, verify

    def due(self, step: int, sync_every: int = 1) -> bool:
        if self.every > 0 and step % self.every == 0:
            return True
        if self.seconds <= 0:
            return False
        late = time.monotonic() - self.last_save >= self.seconds
        if not self.topo.distributed:
            return late
        # ranks must agree to save after the same step: agreed at the metric syncs (an
        # all-reduce every `sync_every` steps, none in between)
        if step % max(1, sync_every):
            return False
        import torch.distributed as dist
        t = torch.tensor([int(late)], device=self.topo.drafter_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def after_step(self, step: int, preempted, state, sync_every: int = 1) -> Path | None:
        """Save when due or preempted; `state()` gives ((epoch, batch) to resume at,
        extra), only computed when a save happens."""
        if not (preempted or self.due(step, sync_every)):
            return None
        position, extra = state()
        return self.save(step, position, extra)

    def save(self, step: int, position: tuple[int, int], extra: dict) -> Path | None:
        """All ranks call this (their anchor RNG states are gathered); rank 0 writes."""
        rng = self.generator.get_state()
        rngs = [rng]
        if self.topo.distributed:
            import torch.distributed as dist
            rngs = [None] * self.topo.world_size
            dist.all_gather_object(rngs, rng)
        self.last_save = time.monotonic()
        if not self.topo.is_main:
            return None
        state = {"drafter": self.drafter.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "anchor_rng": rngs, **extra}
        meta = {"epoch": position[0], "position": position[1], "plan_hash": self.hash,
                "world_size": self.topo.world_size, "identity": self.identity}
        return save(self.dir, step, state, meta, self.keep)

    def find(self):
        """The checkpoint `resume` names: (path, meta, state), or None for a fresh start."""
        if self.resume == "never":
            return None
        if self.resume == "auto":
            return newest_valid(self.dir)
        p = Path(self.resume)
        if (p / "meta.json").exists():
            return (p, *read(p))
        found = newest_valid(p) if p.is_dir() else None
        if found is None:
            raise DataError(f"resume={self.resume}: no valid checkpoint there")
        return found

    def load(self):
        """Restore weights, optimizer, schedule and RNG; the saved state with the step
        and position to start from (None: a fresh start)."""
        return self.restore(self.checked())

    def checked(self):
        """The checkpoint `resume` names, refused in one line when it is another run's, of
        another plan or world size: (path, meta, state), None for a fresh start. The
        trainer asks before anything slow runs (the evaluation before training)."""
        found = self.find()
        if found is None:
            return None
        path, meta, state = found
        if self.verify is not None:
            self.verify(meta, path)
        if meta["plan_hash"] != self.hash and not self.force:
            raise DataError(f"resume from {path}: the plan settings changed since it was written "
                            f"(plan hash {meta['plan_hash']} -> {self.hash}: data, batching, buckets, "
                            "seed, epochs or dp_size); resuming would repeat or skip samples. "
                            "Restore them, or pass checkpoint.force_resume=true")
        if meta["world_size"] != self.topo.world_size:
            raise DataError(f"resume from {path}: written by {meta['world_size']} ranks, "
                            f"{self.topo.world_size} started")
        return found

    def restore(self, found):
        """Load what `checked()` found into the drafter, optimizer, schedule and RNG; the
        saved state with the step and position to start from (None: a fresh start)."""
        if found is None:
            return None
        path, meta, state = found
        try:
            self.drafter.load_state_dict(state["drafter"])
        except RuntimeError as exc:  # shapes or names of another drafter: one line, not a dump
            first = str(exc).strip().splitlines()
            detail = next((ln.strip() for ln in first[1:] if ln.strip()), first[0] if first else "")
            raise DataError(f"resume from {path}: its drafter does not fit this run's "
                            f"model.drafter ({detail[:200]})") from exc
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["anchor_rng"][self.topo.rank])
        log.info("resumed from %s (step %d, epoch %d, batch %d)", path, meta["step"],
                 meta["epoch"], meta["position"])
        return {**state, "step": meta["step"], "epoch": meta["epoch"],
                "position": meta["position"], "path": str(path)}


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint and restored on resume."""
    step: int = 0
    first_loss: float | None = None
    batches_seen: list = field(default_factory=list)  # (epoch, batch) in training order
    eval_curve: list = field(default_factory=list)
    start: tuple[int, int] = (0, 0)  # (epoch, batch) the run starts at
    resumed_from: str | None = None

    @classmethod
    def restore(cls, saved: dict | None) -> "Progress":
        if not saved:
            return cls()
        return cls(saved["step"], saved["first_loss"], [tuple(x) for x in saved["batches_seen"]],
                   saved["eval_curve"], (saved["epoch"], saved["position"]), saved["path"])

    def first_batch(self, epoch: int) -> int:
        return self.start[1] if epoch == self.start[0] else 0

    def snapshot(self, totals) -> dict:
        return {"batches_seen": self.batches_seen, "first_loss": self.first_loss,
                "eval_curve": self.eval_curve, "totals": totals}


# ---- its config section (registered with Hydra by dflash.config) ----

ExportDtype = options("ExportDtype", EXPORT_DTYPES)


@dataclass
class CheckpointConfig:
    # training-state checkpoints (dflash.resume) every N steps and/or every M minutes of
    # wall clock (0: off; with both 0, only on SIGTERM/SIGUSR1). A kill -9 then loses
    # at most that much work, given resume=auto on the rerun
    every_steps: int = 0
    every_minutes: float = 0.0  # also every M minutes of wall clock (0: off)
    # the exported drafter/ (not the training state, which keeps fp32 master weights):
    # auto = bfloat16 when the drafter trains on CUDA (the public drafters' dtype, half
    # the size), float32 on CPU
    dtype: ExportDtype = ExportDtype.auto
    keep: int = 2  # newest checkpoints kept
    force_resume: bool = False  # resume even though the plan settings changed
    # after a preemption checkpoint, requeue the SLURM job (`scontrol requeue`, as
    # submitit does): auto = when running under SLURM (SLURM_JOB_ID set); the requeued
    # job needs resume=auto to go on
    requeue: str = "auto"
