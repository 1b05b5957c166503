"""One training step's peak memory per device, from fake tensors at the real sizes.

The real step (dflash.step.TrainStep: target context -> drafter loss -> backward -> clip
-> AdamW) runs under `FakeTensorMode` on this CPU, its live storage followed op by op
(`LiveBytes`, what torch's `MemTracker` and torchtitan's estimator measure, faster):
nothing is allocated, no weights are read, an 8B target at 49,152 tokens takes seconds.
Checked on real tensors against `MemTracker` (tests/integration/test_preflight.py,
benchmarks/bench_preflight_memory.py).

What a fake CPU run cannot stand for is accounted for explicitly (and said in the notes):
- attention kernels: on a GPU the target runs flash/SDPA kernels and the drafter flex
  attention, none of which materialise the score matrix. Both run here through a
  stand-in with a flash kernel's footprint (output + logsumexp; for the drafter's
  backward the saved q, k, v, out, lse);
- a tensor-parallel target (topology.target_tp=k) is measured as one rank's shard: heads,
  key/value heads and MLP width divided by k, the residual stream (and so every tapped
  layer's output) whole, plus the plain embedding and LM head copies each rank keeps;
- the pipeline's queue holds `depth` more contexts on the drafter device (added);
- CUDA's allocator rounding, the CUDA context (~0.5 GiB) and NCCL buffers are not counted:
  the verdict keeps `headroom` of the device free for them.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from dataclasses import dataclass, field

import torch

from dflash.preflight.live_bytes import LiveBytes, MemTrackerPeak, held_tensors

GiB = float(1 << 30)
# the target's stand-in attention kernel (registered below; a name with "flash" in it
# would mean a hub kernel to transformers)
ESTIMATE_ATTENTION = "estimate_fused"
# loss chunks the estimate runs (every chunk holds the same memory; two show the peak
# with one chunk's outputs already held)
FIRST_CHUNKS = 2


@dataclass
class MemoryEstimate:
    target_gib: float  # the target device's peak (its weights + its forward)
    drafter_gib: float  # the drafter device's peak (weights, grads, AdamW, activations)
    shared: bool  # one device: target_gib its weights, drafter_gib what a step adds
    shape: tuple  # (rows, padded length, anchor slots) measured
    notes: list = field(default_factory=list)

    def per_device(self) -> dict:
        if self.shared:
            return {"target+drafter": self.target_gib + self.drafter_gib}
        return {"target": self.target_gib, "drafter": self.drafter_gib}

    @property
    def peak_gib(self) -> float:
        return max(self.per_device().values())


class _FlashLike(torch.autograd.Function):
    """The footprint of a fused attention kernel (flash / flex): forward keeps q, k, v, out
    and a float32 logsumexp for backward; no [Q, KV] score matrix is ever held."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _flex_stand_in(q, k, v, block_mask=None, enable_gqa=True):
    return _FlashLike.apply(q, k, v)


def _hf_stand_in(module, query, key, value, attention_mask, **kwargs):
    """transformers' attention interface: [B, H, L, D] in, [B, L, H, D] out."""
    return _FlashLike.apply(query, key, value).transpose(1, 2), None


def _register_hf_attention() -> None:
    from transformers import AttentionInterface
    AttentionInterface.register(ESTIMATE_ATTENTION, _hf_stand_in)


def shard_config(hf_config, tp: int):
    """One tensor-parallel rank's view of the target: the sharded widths divided by tp."""
    if tp <= 1:
        return hf_config
    hc = copy.deepcopy(hf_config)
    text = hc.get_text_config() if hasattr(hc, "get_text_config") else hc
    if getattr(text, "head_dim", None) is None:
        text.head_dim = text.hidden_size // text.num_attention_heads
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size",
                "moe_intermediate_size", "shared_expert_intermediate_size"):
        if getattr(text, key, None):
            setattr(text, key, max(1, int(getattr(text, key)) // tp))
    return hc


@contextlib.contextmanager
def _estimating_drafter(first_chunks: bool = True):
    """The drafter's flex path with the stand-in kernel and no BlockMask build (its tile
    indices are a few MB); the fused LM-head loss and DSpark's checkpointed vocabulary
    rows compute their first chunks only (every chunk holds the same memory, so the peak
    is reached there; the rest are hundreds of identical fake ops: seconds a command)."""
    from dflash.kernels import lm_head_loss
    from dflash.model import drafter as drafter_mod
    from dflash.model import dspark_loss

    real = lm_head_loss.RowLosses
    real_rows = dspark_loss.dspark_rows

    class FirstChunks(real):
        @staticmethod
        def forward(ctx, hidden, chunk_fn, chunk):
            def some(s, e, need_grad):
                if s < FIRST_CHUNKS * chunk:
                    return chunk_fn(s, e, need_grad)
                n = e - s
                return (hidden.new_empty(n, dtype=torch.float32),
                        hidden.new_empty(n, dtype=torch.int64),
                        hidden.new_empty(n, hidden.shape[1]) if need_grad else None)
            return real.forward(ctx, hidden, some, chunk)

    def first_rows(h, t, w1p, head, w2, targets, inside, chunk_mb=256):
        keep = min(h.shape[0], FIRST_CHUNKS * dspark_loss.rows_per_chunk(head, chunk_mb))
        sl = slice(0, keep)
        out = real_rows(h[sl], t[sl], None if w1p is None else w1p[sl], head, w2,
                        targets[sl], inside[sl], chunk_mb)
        rest = h.shape[0] - keep  # the rest's per-row results: a few bytes a row
        return tuple(torch.cat([x, x.new_empty(rest)]) for x in out)

    saved = (drafter_mod.flex_attention_fn, drafter_mod.MASKS["flex"], real, real_rows)
    drafter_mod.flex_attention_fn = lambda device: _flex_stand_in
    drafter_mod.MASKS["flex"] = lambda *a, **k: None
    if first_chunks:
        lm_head_loss.RowLosses = FirstChunks
        dspark_loss.dspark_rows = first_rows
    try:
        yield
    finally:
        (drafter_mod.flex_attention_fn, drafter_mod.MASKS["flex"], lm_head_loss.RowLosses,
         dspark_loss.dspark_rows) = saved


def build_step(hf_config, cfg, rows: int, seq_len: int, anchors: int, mask_token_id: int,
               device: str = "cpu", fake_attention: bool = True, drafter_config=None,
               first_layers: bool = True):
    """(target, TrainStep, batch) of this run's real step parts at the given shape;
    `drafter_config`: the whole target's config where `hf_config` is one TP shard's (the
    drafter keeps the whole target's widths on every rank)."""
    from transformers import AutoModelForCausalLM
    from dflash.model.drafter import DFlashDrafter, DrafterSpec
    from dflash.model.loss import FINAL_HIDDEN_KINDS, Objective
    from dflash.model.target import Target
    from dflash.optim import build_optimizer
    from dflash.options import choice
    from dflash.step import DeviceBatch, StepPolicy, TrainStep

    m, loss = cfg.model, cfg.loss
    dtype = getattr(torch, str(m.target.dtype))
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            lm = AutoModelForCausalLM.from_config(hf_config)
    finally:
        torch.set_default_dtype(old)
    if fake_attention:
        _register_hf_attention()
        lm.set_attn_implementation(ESTIMATE_ATTENTION)
    else:
        lm.set_attn_implementation("sdpa")
    target = Target(lm, list(m.target.layer_ids) if m.target.layer_ids else None)
    if first_layers and choice(loss.kind) not in FINAL_HIDDEN_KINDS:
        # the forward keeps only the tapped outputs and each layer's transient is the
        # same: tapping the first n layers gives the same peak as the real taps, for
        # the ops of n layers instead of up to 34 (every layer's weights stay counted)
        target.layer_ids = list(range(len(target.layer_ids)))
    spec = DrafterSpec.from_target(target, m.drafter, mask_token_id)
    if spec.markov_rank and int(loss.get("draft_vocab", 0)) > 0:  # W2 over the kept ids
        spec = dataclasses.replace(spec, draft_rows=min(int(loss.draft_vocab), spec.vocab_size))
    if drafter_config is not None:
        full = drafter_config.get_text_config() if hasattr(drafter_config, "get_text_config") \
            else drafter_config
        spec = dataclasses.replace(
            spec, num_heads=full.num_attention_heads, num_kv_heads=full.num_key_value_heads,
            intermediate_size=full.intermediate_size,
            head_dim=getattr(full, "head_dim", None) or full.hidden_size // full.num_attention_heads)
    with torch.device(device):
        drafter = DFlashDrafter(spec)
    drafter.set_attention("flex" if fake_attention else "chunked")
    optimizer, scheduler = build_optimizer(drafter.parameters(), cfg.optim, 1000,
                                           drafter.norm.weight, float(m.drafter.norm_lr_scale))
    objective = Objective(num_anchors=anchors, gamma=float(loss.gamma), chunk=int(m.loss_chunk),
                          chunk_mb=float(m.loss_chunk_mb), impl="torch", kind=choice(loss.kind),
                          dpace_alpha=float(loss.dpace_alpha), norm=choice(loss.norm),
                          dspark_weights=tuple(float(x) for x in loss.get("dspark_weights", (0.1, 0.9, 1.0))),
                          batch_weight=1.0)
    policy = StepPolicy(grad_clip=float(cfg.optim.grad_clip), autocast=choice(m.autocast),
                        micro_rows=int(cfg.optim.get("micro_rows", 0)))
    step = TrainStep(target, drafter, optimizer, scheduler, objective, policy,
                     generator=torch.Generator(device=device).manual_seed(0))
    with torch.device(device):
        ids = torch.randint(0, int(spec.vocab_size) - 2, (rows, seq_len))
        ones = torch.ones(rows, seq_len, dtype=torch.bool)
    return target, drafter, step, DeviceBatch(None, ids, ones, ones)


def measure(target, drafter, step, batch, queue_depth: int = 0,
            shared: bool = False, tracker=None) -> tuple[float, float]:
    """(target device peak, drafter device peak) in bytes of one step as built; on a
    shared device the drafter's figure is what it adds to the target's weights."""
    held = {}

    def target_stage():
        held["ctx"] = step.context(batch)

    tracker = tracker or LiveBytes
    with tracker(*held_tensors(target.lm)) as mt:
        target_stage()
    t_peak = mt.peak
    ctx = held.pop("ctx")
    ctx_bytes = ctx.numel() * ctx.element_size()
    _init_adamw_state(step.optimizer)  # as after the first step: the state held throughout
    micro = step.policy.micro_rows
    if 0 < micro < batch.ids.shape[0]:
        # every slice holds the same activations: one slice's step is the peak (the
        # whole context stays held, counted below)
        sl = slice(0, micro)
        batch = type(batch)(None, batch.ids[sl], batch.loss_mask[sl], batch.valid[sl])
        ctx = ctx[sl]
    # the drafter reads the target's embedding and LM head (on a device of its own, a
    # copy of them) and the context: held from the start, so a view of them is no new
    # storage
    shared_weights = list({id(t): t for t in
                           (target.lm_head_weight, target.embed_tokens.weight)}.values())
    with tracker(*held_tensors(drafter, step.optimizer), ctx, *shared_weights) as mt:
        step.drafter_step(batch, ctx)
    d_peak = mt.peak + ctx_bytes * queue_depth  # the queue's further contexts
    if shared:  # one device: the target's weights, then the larger of the two stages
        weights = sum(t.untyped_storage().nbytes() for t in held_tensors(target.lm))
        d_peak -= sum(t.untyped_storage().nbytes() for t in shared_weights)
        return weights, max(d_peak, t_peak - weights)
    return t_peak, d_peak


def _init_adamw_state(opt) -> None:
    for group in opt.param_groups:
        for p in group["params"]:
            opt.state[p] = {"step": torch.tensor(0.0),  # (a constant: fake mode reads it)
                            "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}


def estimate(hf_config, cfg, rows: int, seq_len: int, anchors: int, mask_token_id: int,
             tp: int = 1, shared: bool = False, queue_depth: int = 2,
             real: bool = False, every_chunk: bool = False) -> MemoryEstimate:
    """One step's peak per device at (rows, seq_len, anchors), on fake tensors; `real`:
    the same step on real tensors (every target layer, every loss chunk) followed by
    torch's MemTracker: what the estimate is checked against on a CPU; `every_chunk`:
    fake tensors through every loss chunk (what the first chunks stand for)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    notes = ["attention: flash/flex footprint (no score matrix), as the GPU kernels"]
    if tp > 1:
        notes.append(f"target: one of {tp} tensor-parallel shards (heads and MLP / {tp}, "
                     "residual whole) + its plain embedding and LM head copies")
    mode = contextlib.nullcontext() if real else FakeTensorMode(allow_non_fake_inputs=True)
    with mode, _estimating_drafter(first_chunks=not (real or every_chunk)):
        target, drafter, step, batch = build_step(shard_config(hf_config, tp), cfg, rows,
                                                  seq_len, anchors, mask_token_id,
                                                  drafter_config=hf_config, first_layers=not real)
        t_peak, d_peak = measure(target, drafter, step, batch, 0 if shared else queue_depth,
                                 shared, tracker=MemTrackerPeak if real else None)
    if tp > 1:  # each rank keeps whole copies of the embedding and the LM head
        head = target.lm_head_weight
        t_peak += 2 * head.numel() * head.element_size()
    if not shared and queue_depth:
        notes.append(f"pipeline: {queue_depth} more contexts queued on the drafter device")
    return MemoryEstimate(t_peak / GiB, d_peak / GiB, shared, (rows, seq_len, anchors), notes)
