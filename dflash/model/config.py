"""The `model` and `loss` groups' schemas: target, drafter, their kernels, the objective."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from dflash.kernels.lm_head_loss import LOSS_IMPLS
from dflash.model.drafter import ATTENTION_BACKENDS
from dflash.model.loss import LOSS_KINDS, LOSS_NORMS
from dflash.errors import require
from dflash.options import options

# option tuples of the model group that the code below this package reads too
AUTOCAST = ("auto", "native", "bf16", "bfloat16", "off")  # model.autocast (bf16 = bfloat16)
COMPILE_MODES = ("off", "static", "dynamic")  # model.compile

LossImpl = options("LossImpl", LOSS_IMPLS)
Attention = options("Attention", ATTENTION_BACKENDS)
Autocast = options("Autocast", AUTOCAST)
Compile = options("Compile", COMPILE_MODES)
LossNorm = options("LossNorm", LOSS_NORMS)
LossKind = options("LossKind", LOSS_KINDS)


@dataclass
class TargetConfig:
    path: Optional[str] = None  # local HF model dir; None builds the tiny model below
    # the tiny model's sizes (a local model's come from its config.json: model=hf nulls
    # these, so the resolved config records no size that was not trained)
    hidden_size: Optional[int] = 64
    num_hidden_layers: Optional[int] = 6
    num_attention_heads: Optional[int] = 4
    num_key_value_heads: Optional[int] = 2
    intermediate_size: Optional[int] = 128
    vocab_size: Optional[int] = 512
    seed: int = 0  # the tiny model's init seed
    # float32 | bfloat16 | float16 | auto | native: the target's weights (auto: bfloat16
    # on CUDA, float32 on CPU; native: bfloat16 wherever it is native, CUDA or a CPU with
    # AVX512-BF16 / AMX, float32 where it would be emulated)
    dtype: str = "float32"
    layer_ids: Optional[List[int]] = None  # None: 5 layers spread from 1 to L-3
    # HF attention kernel: sdpa, eager, flex_attention, flash_attention_2, ... None: the
    # tiny model uses sdpa, a local model whatever HF picks for it. Packed rows need one
    # that reads documents from position_ids (all of these do); flash/flex skip the
    # cross-document work that sdpa's dense per-row mask still pays for.
    attn_implementation: Optional[str] = None
    # the in-memory model (path null) is built here: "cuda" builds a large random target
    # (the published 8B sizes: benchmarks/gpu_check.py) on the GPU, in `dtype`, never in
    # host fp32 first
    build_device: str = "cpu"
    # > 0: each training sample's context kept on the host (up to this many MB a rank)
    # and reused in later epochs instead of running the frozen target again: for small
    # data sets trained many epochs (dflash/model/feature_cache.py). 0: off
    cache_mb: float = 0


@dataclass
class DrafterConfig:
    # drafter decoder layers (the paper: 5 for 8B targets; experiment=production derives
    # it from the target's class: dflash/model/derive.py)
    num_layers: int = 1
    block_size: int = 16  # tokens a block drafts, the anchor included
    num_anchors: int = 512  # anchor slots per row (blocks trained per sample)
    # the block's mask input; None: the last embedding row. A drafter must be served
    # with the id it was trained with (null in model=hf: derived from the target's tokenizer, Qwen3's 151669);
    # a data set holding this id is refused, naming the sample
    mask_token_id: Optional[int] = None
    seed: int = 0  # the drafter's init seed and its anchor sampling
    # warm start: a drafter dir in the public DFlash layout (a published drafter, or a
    # run's drafter/) loaded before step 1, weights only (optimizer and schedule fresh);
    # its shape, taps, block size, mask token and vocabulary must match this run's
    init: Optional[str] = None
    # a fresh drafter's output norm weight. At 1 (HF's init) a block position's hidden
    # state is still mostly its input (mask) embedding, which a tied LM head scores far
    # above the truth: SmolLM2-135M's first loss is 53.5 against ln(49,152) = 10.8. At 0
    # every first logit is 0 (first loss ln V exactly), but AdamW grows the weight by
    # ~lr a step, which slowed the world's run (acceptance 1.98 against ~2.9 after 320
    # steps), so 1 stays the tiny world's default; model=hf starts at 0 and learns it at
    # 10x lr (norm_lr_scale), the best of a real-model A/B (conf/model/hf.yaml)
    norm_init: float = 1.0
    # the final norm weight learns at lr x this. AdamW moves a weight by about lr a step
    # whatever its gradient, so a norm started at 0 (first loss ln V exactly) needs ~1/lr
    # steps to reach a useful scale at 1; model=hf starts at 0 and learns it at 10x
    norm_lr_scale: float = 1.0
    # layer layout, as the public drafter configs write it: per layer full_attention |
    # sliding_attention (null: all full), the window W (a query at q sees q - (W - 1)
    # .. q), and causal: in-block attention k' <= k in every layer (exported explicitly
    # as is_causal and dflash_config.causal; engines default it differently)
    layer_types: Optional[List[str]] = None
    sliding_window: Optional[int] = None  # W for sliding_attention layers
    causal: bool = False  # in-block attention k' <= k in every layer
    # DSpark (dflash/model/dspark.py; train with loss=dspark): the Markov head's rank (0:
    # plain DFlash; DeepSpec 256) and the confidence head (needs a rank > 0)
    markov_rank: int = 0
    confidence_head: bool = False
    # the block layout: false - slot 0 is the anchor, slots 1..B-1 draft (B-1 drafts, the
    # z-lab layout); true - anchor-first, slot k drafts anchor + k + 1 (B drafts, DeepSpec)
    sample_from_anchor: bool = False


def check_drafter_config(d) -> None:
    """`model.drafter.*` sizes that cannot make a drafter, refused at start (a block of
    one token drafts nothing unless anchor-first; 0 layers or anchors fail in torch)."""
    require(int(d.num_layers) >= 1, "model.drafter.num_layers", d.num_layers, ">= 1")
    least = 1 if bool(d.sample_from_anchor) else 2
    require(int(d.block_size) >= least, "model.drafter.block_size", d.block_size,
            f">= {least} (the anchor and at least one draft)" if least == 2 else ">= 1")
    require(int(d.num_anchors) >= 1, "model.drafter.num_anchors", d.num_anchors, ">= 1")


@dataclass
class ModelConfig:
    name: str = "tiny"  # the model group's name (recorded in summary.json)
    target: TargetConfig = field(default_factory=TargetConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    loss_impl: LossImpl = LossImpl.auto  # auto | torch | triton: the fused LM-head loss kernel
    # auto: flex_attention on CUDA; on CPU SDPA per chunk of blocks (chunked), or one
    # dense SDPA mask (sdpa) under torch.compile (dflash/model/masks.py)
    attention: Attention = Attention.auto
    # rows per LM-head chunk; 0: as many as fit loss_chunk_mb of logits at this
    # vocabulary (peak memory then follows the target, see kernels/lm_head_loss.py)
    loss_chunk: int = 0
    loss_chunk_mb: int = 256  # logits memory per chunk when loss_chunk is 0
    # bf16 autocast for the drafter (fp32 master weights); auto: on CUDA only; native:
    # where bf16 is native (CUDA, or a CPU with AVX512-BF16 / AMX), off where emulated
    autocast: Autocast = Autocast.auto
    # torch.compile of the drafter forward (block mask included): static compiles one
    # graph per warmed shape, dynamic one symbolic graph; off runs eager
    compile: Compile = Compile.off
    # torch.compile's backend: inductor generates kernels; eager (or aot_eager) runs the
    # same dynamo graphs under the same guards (what warmup and the compile monitor
    # count) without code generation, for checks on a small CPU (the suite uses eager)
    compile_backend: str = "inductor"


def check_loss_config(loss) -> None:
    """`loss.*` values that cannot weigh a block (gamma 0 divides by zero: NaN at step 1)."""
    require(float(loss.gamma) > 0, "loss.gamma", loss.gamma, "> 0 (a decay over the block)")
    require(0 <= float(loss.dpace_alpha) <= 1, "loss.dpace_alpha", loss.dpace_alpha, "in [0, 1]")
    require(float(loss.kl_temperature) > 0, "loss.kl_temperature", loss.kl_temperature, "> 0")
    weights = [float(w) for w in loss.dspark_weights]
    require(len(weights) == 3 and all(w >= 0 for w in weights) and sum(weights) > 0,
            "loss.dspark_weights", weights, "three non-negative weights, not all 0 "
            "([CE on the Markov-biased logits, L1 to the target, confidence BCE])")


@dataclass
class LossConfig:
    """The drafter's objective (`loss=ce|dpace|kl|dspark`): a sweep over objectives is one override."""
    name: str = "ce"  # the loss group's name
    # ce: block position k weighs exp(-(k-1)/gamma); dpace: D-PACE's weights
    # w_j = sum_{m>=j} prod_{i<=m} ((1-a) q_i + a), q_i = exp(-CE_i) detached; kl:
    # distillation to the target's distribution
    kind: LossKind = LossKind.ce
    gamma: float = 7.0  # ce: block position k weighs exp(-(k-1)/gamma)
    dpace_alpha: float = 0.5  # dpace: a in (1 - a) q + a
    # kl: KL(target || drafter) at every block position, both at this temperature (x T^2),
    # weighted by the ce decay; the target then runs every layer (its final hidden state)
    kl_temperature: float = 1.0
    # plan: every supervised (block position, token) counts the same whatever batch or
    # rank it lands in (ce: weighted sum / the plan's mean weight per batch, known before
    # step 1; dpace: / the D-PACE weight of the whole step over every rank); batch: the
    # weighted mean of each batch (a block weighs 1 / its batch's weight, so each
    # strategy re-weights the data its own way). See docs/objective.md.
    norm: LossNorm = LossNorm.plan
    # ce / dpace: > 0 runs the training softmax over the N token ids supervised most often
    # in the training samples (a frequency-ranked draft vocabulary, as FR-Spec / EAGLE-3);
    # targets outside it carry no loss and count as misses. Drafting still uses the whole
    # LM head. 0: the whole vocabulary. (dflash/model/draft_vocab.py)
    draft_vocab: int = 0
    # dspark: the weights of CE / L1 to the target / confidence BCE (DeepSpec 0.1 / 0.9 / 1)
    dspark_weights: List[float] = field(default_factory=lambda: [0.1, 0.9, 1.0])
