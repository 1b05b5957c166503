"""One training step, split into the two stages the pipeline runs apart.

    target stage   collated batch -> frozen target context (no grad, early stop)
    drafter stage  context -> anchors -> drafter -> fused LM-head CE -> backward ->
                   clip -> AdamW -> LR schedule

Nothing here reads a value back to the host: the step's metrics are device tensors
that `dflash.metrics.StepMetrics` sums, and the trainer synchronises them every
`logger.log_every` steps. Mixed precision: the target runs in its own dtype (bf16 for production); the
drafter keeps fp32 master weights and computes under `torch.autocast` when enabled.
"""
from __future__ import annotations

import logging
import platform
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from dflash.model.dspark import num_drafts
from dflash.model.dspark_loss import slot_weights
from dflash.model.loss import (FINAL_HIDDEN_KINDS, Objective, block_targets, combined,
                               drafter_loss, sample_anchors)
from dflash.errors import ConfigError
from dflash.options import choice

log = logging.getLogger("dflash.step")

# bf16 and bfloat16 are one dtype (checkpoint.dtype takes both spellings too)
NONFINITE = ("stop", "skip")


@dataclass
class DeviceBatch:
    """A collated batch on its device, with the plan's own Batch beside it."""
    batch: object  # dflash.batching.epoch_plan.Batch
    ids: torch.Tensor  # [B, S] int64
    loss_mask: torch.Tensor  # [B, S] bool
    valid: torch.Tensor  # [B, S] bool
    shape: object = None  # dflash.warmup.shapes.Shape the batch runs at (None: its natural shape)
    # packed rows: position of each token inside its own document [B, S] int64 (the
    # target and the drafter keep attention inside documents from it); None: unpacked
    position_ids: torch.Tensor | None = None

    @property
    def padded_tokens(self) -> int:
        return int(self.ids.numel())


def autocast_for(device: torch.device, mode: str):
    """`model.autocast`: auto = bf16 on CUDA, off elsewhere; native = bf16 where the
    device has it natively (native_dtype); bf16 (= bfloat16) | off force it."""
    if mode == "off" or (mode == "auto" and device.type != "cuda") or (
            mode == "native" and native_dtype(device) != "bfloat16"):
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def emulated_bf16(device: torch.device) -> bool:
    """True on an x86 CPU without bf16 dot products (AVX512-BF16 or AMX): bf16 matmuls
    are emulated there and run slower than float32 (on one with them, ~2x faster)."""
    if device.type != "cpu" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    native = [getattr(torch.cpu, f, None) for f in ("_is_avx512_bf16_supported",
                                                     "_is_amx_tile_supported")]
    if native[0] is None:  # a torch that cannot say: assume nothing
        return False
    return not any(f() for f in native if f is not None)


def native_dtype(device: torch.device) -> str:
    """bfloat16 where the device computes it natively (CUDA; a CPU with AVX512-BF16 or
    AMX: ~2x float32 there), float32 where bf16 would be emulated (3.5x slower)."""
    if device.type == "cuda" or (device.type == "cpu" and not emulated_bf16(device)
                                 and platform.machine().lower() in ("x86_64", "amd64")):
        return "bfloat16"
    return "float32"


def resolve_target_dtype(target_cfg, device: torch.device) -> str:
    """`model.target.dtype` for this device: auto = bfloat16 on CUDA, float32 on a CPU
    (the figures CPU tests compare); native = native_dtype. Resolved in place, so all
    that reads the config later (the summary, a parts manifest) sees what ran."""
    name = str(target_cfg.dtype)
    if name == "auto":
        target_cfg.dtype = "bfloat16" if device.type == "cuda" else "float32"
    elif name == "native":
        target_cfg.dtype = native_dtype(device)
    return str(target_cfg.dtype)


BF16_OFF = {"model.autocast": "model.autocast=off",
            "model.target.dtype": "model.target.dtype=float32"}


def emulated_bf16_warning(keys: list, device: torch.device) -> str | None:
    """One line for the bf16 config `keys` (of BF16_OFF) set where bf16 is emulated,
    naming what to set instead; None where nothing is to be said."""
    if not keys or not emulated_bf16(device):
        return None
    return (f"{' and '.join(keys)}: bf16 on a CPU without AVX512-BF16 or AMX is emulated, "
            f"slower than float32 here: set {' '.join(BF16_OFF[k] for k in keys)}")


@dataclass(frozen=True)
class StepPolicy:
    """How the update is taken: clipping, mixed precision, non-finite handling."""
    grad_clip: float = 1.0  # 0: no clip
    autocast: str = "auto"  # auto = bf16 on CUDA only | bf16 | off
    log_grad_norm: bool = True  # without a clip the norm costs a reduction: optional
    nonfinite: str = "stop"  # stop (found at the next sync) | skip (one host read a step)
    # > 0: the drafter's forward and backward take this many rows of a batch at a time,
    # gradients accumulating, one update: the same step in less activation memory
    micro_rows: int = 0

    def __post_init__(self):
        if self.nonfinite not in NONFINITE:
            raise ConfigError(f"optim.nonfinite must be 'stop' or 'skip', got {self.nonfinite!r}")
        if self.micro_rows < 0:
            raise ConfigError(f"optim.micro_rows={self.micro_rows}: 0 (whole batches) or more")

    @classmethod
    def build(cls, cfg, device: torch.device) -> "StepPolicy":
        """From `optim.*`, `model.autocast` and `logger.grad_norm`; bf16 asked for where the
        device emulates it is logged once, naming what to set instead."""
        o, m = cfg.optim, cfg.model
        bf16 = [k for k, on in (("model.autocast", choice(m.autocast) in ("bf16", "bfloat16")),
                                ("model.target.dtype", m.target.dtype == "bfloat16")) if on]
        warning = emulated_bf16_warning(bf16, device)
        if warning:
            log.warning(warning)
        return cls(grad_clip=float(o.grad_clip), autocast=choice(m.autocast),
                   log_grad_norm=bool(cfg.logger.grad_norm), nonfinite=choice(o.nonfinite),
                   micro_rows=int(o.micro_rows))


def ranks_sum(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x summed over the data-parallel ranks (no host sync), and the rank count."""
    x = x.detach().clone()
    torch.distributed.all_reduce(x)
    return x, torch.distributed.get_world_size()


class TrainStep:
    def __init__(self, target, drafter, optimizer, scheduler, objective: Objective,
                 policy: StepPolicy = StepPolicy(), generator: torch.Generator | None = None,
                 module=None, local=None, feature_cache=None):
        self.target, self.drafter = target, drafter
        # dflash.model.feature_cache.FeatureCache: each sample's context kept across epochs
        self.feature_cache = feature_cache
        # `module` runs the training forward (a DDP wrapper of `local`); `local` is the
        # same forward without DDP (compiled when `model.compile` is on), for warmup;
        # `drafter` owns the weights
        self.local = local if local is not None else drafter
        self.module = module if module is not None else self.local
        self.optimizer, self.scheduler = optimizer, scheduler
        self.objective, self.policy = objective, policy
        self.device = next(drafter.parameters()).device
        self.target_device = next(target.parameters()).device
        self.generator = generator or torch.Generator(device=self.device).manual_seed(0)
        # the warm run draws its anchors from its own stream: training's stays untouched
        self.warm_generator = torch.Generator(device=self.device).manual_seed(1)
        dist = torch.distributed
        self.reduce_sum = (ranks_sum if dist.is_available() and dist.is_initialized()
                           and dist.get_world_size() > 1 else None)

    # ---- target stage --------------------------------------------------------------
    def context(self, b: DeviceBatch) -> torch.Tensor:
        # distillation reads the target's own distribution: its final hidden state rides
        # along as the context's last H channels
        final = self.objective.kind in FINAL_HIDDEN_KINDS
        if self.feature_cache is not None and b.batch is not None:  # (warm batches: no ids)
            return self.feature_cache.context(
                lambda ids: self.target.context(ids, None, None, final=final), b.ids, b.batch)
        if b.position_ids is not None:
            # packed: no 2-D mask, per-document positions; HF builds the document mask
            # from where the positions restart (sdpa, eager, flex and flash alike)
            return self.target.context(b.ids, None, b.position_ids, final=final)
        # rows are right-padded: under the causal mask alone no real token sees a pad,
        # so no padding mask is built (attention takes its causal kernel: ~15-30% less
        # target time on CPU sdpa, and flash rather than a masked kernel on GPU); what
        # the pads themselves compute is never read (nothing valid there)
        return self.target.context(b.ids, None, final=final)

    # ---- drafter stage -------------------------------------------------------------
    def _loss(self, module, b: DeviceBatch, ctx: torch.Tensor, generator, reduce_sum=None,
              anchors=None, step_weight=None):
        module.train()
        with autocast_for(self.device, self.policy.autocast):
            return drafter_loss(module, ctx, self.target.embed_tokens,
                                self.target.lm_head_weight, b.ids, b.loss_mask, b.valid,
                                self.objective, generator, anchors=anchors,
                                position_ids=b.position_ids, reduce_sum=reduce_sum,
                                step_weight=step_weight)

    def _step_weight(self, b: DeviceBatch, anchors) -> tuple:
        """(dspark's slot weights summed over the whole batch and every rank, ranks)."""
        spec = self.drafter.spec
        n = num_drafts(spec)
        _, sup = block_targets(b.ids, b.loss_mask, b.valid, anchors[0], anchors[1], n + 1,
                               b.position_ids)
        total = slot_weights(n, self.objective.gamma, sup).sum()
        return self.reduce_sum(total) if self.reduce_sum is not None else (total, 1)

    def warm_step(self, b: DeviceBatch, ctx: torch.Tensor) -> None:
        """Forward and backward of the real step without the update (the bare drafter:
        no DDP all-reduce, so ranks may warm at their own pace)."""
        out = self._loss(self.local, b, ctx, self.warm_generator)
        out.loss.backward()
        self.optimizer.zero_grad(set_to_none=True)

    def _slices(self, b: DeviceBatch) -> list:
        rows, mr = b.ids.shape[0], self.policy.micro_rows
        if mr <= 0 or rows <= mr:
            return [slice(None)]
        return [slice(i, min(rows, i + mr)) for i in range(0, rows, mr)]

    def _forward_backward(self, b: DeviceBatch, ctx: torch.Tensor):
        """The loss and its gradients: the whole batch at once, or (optim.micro_rows)
        row slices of it, each forward and backward alone with the gradients adding up.
        The anchors are drawn for the whole batch first (the same draw either way) and
        every slice's loss is over the plan's constant, so the sum is the whole loss."""
        parts = self._slices(b)
        if len(parts) == 1:
            out = self._loss(self.module, b, ctx, self.generator, self.reduce_sum)
            out.loss.backward()
            return out
        ob = self.objective
        if ob.norm != "plan" or ob.kind == "dpace":
            raise ConfigError("optim.micro_rows needs loss.norm=plan with loss=ce, kl or dspark: "
                              "the others divide by a weight of the whole batch's outputs")
        anchors = sample_anchors(b.loss_mask, b.valid, ob.num_anchors, self.generator,
                                 b.position_ids, ob.anchors_per_document)
        # dspark divides by the whole step's weight, which the data alone decides: known
        # before any slice runs
        step_weight = self._step_weight(b, anchors) if ob.kind == "dspark" else None
        outs = []
        for i, sl in enumerate(parts):
            part = DeviceBatch(b.batch, b.ids[sl], b.loss_mask[sl], b.valid[sl], b.shape,
                               None if b.position_ids is None else b.position_ids[sl])
            last = i == len(parts) - 1
            sync = (self.module.no_sync() if hasattr(self.module, "no_sync") and not last
                    else nullcontext())  # DDP all-reduces the summed gradients once
            with sync:
                out = self._loss(self.module, part, ctx[sl], None, None,
                                 anchors=(anchors[0][sl], anchors[1][sl]), step_weight=step_weight)
                out.loss.backward()
            outs.append(out)
        return combined(outs)

    def drafter_step(self, b: DeviceBatch, ctx: torch.Tensor) -> dict:
        # (warm_step never reduces: rank 0 warms while the others wait)
        self.optimizer.zero_grad(set_to_none=True)
        out = self._forward_backward(b, ctx)
        pol = self.policy
        params = [p for p in self.drafter.parameters() if p.grad is not None]
        if pol.grad_clip > 0:  # the norm comes with the clip
            grad_norm = torch.nn.utils.clip_grad_norm_(params, pol.grad_clip)
        elif pol.log_grad_norm:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        else:  # no clip and not logged: skip a reduction over every parameter
            grad_norm = torch.zeros((), device=self.device)
        lr = self.optimizer.param_groups[0]["lr"]
        skipped = False
        if pol.nonfinite == "skip":  # the one host read of this mode
            total = grad_norm if grad_norm.numel() and (pol.grad_clip > 0 or pol.log_grad_norm) \
                else torch.zeros((), device=self.device)
            skipped = not bool(torch.isfinite(out.loss.detach()) & torch.isfinite(total))
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)  # no update from this batch
        else:
            self.optimizer.step()
        self.scheduler.step()  # the schedule follows steps taken, skipped or not
        return {"loss": out.ce.float(), "accept_est": out.accept_len.float(),
                "acc": out.acc.float(), "grad_norm": grad_norm.detach().float(), "lr": lr,
                "rows": out.rows, "skipped": skipped}

    def __call__(self, b: DeviceBatch) -> dict:
        return self.drafter_step(b, self.context(b))


def seeded_generator(device: torch.device, seed: int, rank: int = 0) -> torch.Generator:
    """Anchor draws: one stream per (seed, rank), on the device that uses it."""
    g = torch.Generator(device=device)
    g.manual_seed(int(np.random.SeedSequence([int(seed), int(rank), 77]).generate_state(1)[0]))
    return g
