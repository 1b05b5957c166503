"""Typed schemas for every config group.

Each group's YAML merges into one of these dataclasses (registered with Hydra's
ConfigStore and named first in each app's defaults list), so a misspelled key or a
value of the wrong type fails at start with Hydra's message naming the full key.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from dflash.batching.boundaries import COMPUTED
from dflash.batching.distributed import REMAINDERS
from dflash.batching.strategies import STRATEGIES
from dflash.data.build import SOURCES
from dflash.data.prompt_formats import FORMATS as PROMPT_FORMATS
from dflash.data.overlong import POLICIES as OVERLONG
from dflash.kernels.lm_head_loss import LOSS_IMPLS
from dflash.model.drafter import ATTENTION_BACKENDS
from dflash.generation.requests import TURNS
from dflash.model.checkpoint import EXPORT_DTYPES
from dflash.model.loss import LOSS_KINDS, LOSS_NORMS
from dflash.step import AUTOCAST, NONFINITE
from dflash.topology import DEVICES
from dflash.warmup.monitor import ON_COMPILE
from dflash.warmup.run import COMPILE_MODES
from dflash.warmup.shapes import POLICIES
from dflash.options import options


Source = options("Source", SOURCES)
Overlong = options("Overlong", OVERLONG)
Strategy = options("Strategy", STRATEGIES)
Remainder = options("Remainder", REMAINDERS)
BucketKind = options("BucketKind", ("fixed", *COMPUTED))
LossImpl = options("LossImpl", LOSS_IMPLS)
Attention = options("Attention", ATTENTION_BACKENDS)
WarmupPolicy = options("WarmupPolicy", POLICIES)
Compile = options("Compile", COMPILE_MODES)
OnCompile = options("OnCompile", ON_COMPILE)
NonFinite = options("NonFinite", NONFINITE)
Device = options("Device", DEVICES)
LoggerMode = options("LoggerMode", ("online", "offline", "disabled"))
Autocast = options("Autocast", AUTOCAST)
LossNorm = options("LossNorm", LOSS_NORMS)
LossKind = options("LossKind", LOSS_KINDS)
ExportDtype = options("ExportDtype", EXPORT_DTYPES)
RegenBackend = options("RegenBackend", ("local", "openai"))
RegenDecoding = options("RegenDecoding", ("auto", "plain", "lookup"))
RegenTurns = options("RegenTurns", TURNS)
TruncatedPolicy = options("TruncatedPolicy", ("keep", "drop"))
BadLines = options("BadLines", ("skip", "error"))
PromptFormat = options("PromptFormat", ("prompt_ids", *PROMPT_FORMATS))
ChatFormat = options("ChatFormat", PROMPT_FORMATS)


@dataclass
class DataConfig:
    # synthetic: generated on the fly (cached on disk); tokenized: a directory written by
    # `dflash.data.prepare`; lengths: a 1-D .npy of sample lengths (planning only).
    source: Source = Source.synthetic
    path: Optional[str] = None  # tokenized: the data set dir; lengths: the .npy file
    num_samples: int = 2000  # synthetic / world: how many samples
    # Synthetic lengths follow the production profile scaled by this factor, so CPU runs
    # keep the shape of the distribution at a fraction of the tokens.
    length_scale: float = 0.0625
    min_length: int = 16  # synthetic / world: the shortest sample
    vocab_size: int = 512  # synthetic / world: token ids drawn below this
    max_seq_len: int = 8192  # a sample longer than this meets `overlong`
    overlong: Overlong = Overlong.error  # truncate | drop | error, for samples over max_seq_len
    seed: int = 0  # synthetic / world: the data's seed
    # where generated data and the fitted world target are cached
    cache_dir: str = "${oc.env:DFLASH_CACHE,.cache/dflash}"
    # world: motif slots and the token range of each slot; steps to fit the tiny target
    period: int = 8
    slot_size: int = 8
    target_fit_steps: int = 500  # world: training steps that fit its tiny target
    # world: rows of 96 tokens a fit step takes (every other step a quarter as many rows
    # of 384); the test suite's small world fits at 16, in two thirds of the time
    target_fit_batch: int = 32


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
    dtype: str = "float32"  # float32 | bfloat16 | float16: the target's weights
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


@dataclass
class DrafterConfig:
    num_layers: int = 1  # drafter decoder layers (the paper: 5 for 8B targets)
    block_size: int = 16  # tokens a block drafts, the anchor included
    num_anchors: int = 512  # anchor slots per row (blocks trained per sample)
    # the block's mask input; None: the last embedding row. A drafter must be served
    # with the id it was trained with (model=qwen3_8b sets the public drafters' 151669);
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
    # steps), so 1 stays the tiny world's default; model=hf starts at 0.05, the best of
    # a real-model A/B (conf/model/hf.yaml)
    norm_init: float = 1.0
    # layer layout, as the public drafter configs write it: per layer full_attention |
    # sliding_attention (null: all full), the window W (a query at q sees q - (W - 1)
    # .. q), and causal: in-block attention k' <= k in every layer (exported explicitly
    # as is_causal and dflash_config.causal; engines default it differently)
    layer_types: Optional[List[str]] = None
    sliding_window: Optional[int] = None  # W for sliding_attention layers
    causal: bool = False  # in-block attention k' <= k in every layer


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
    # bf16 autocast for the drafter (fp32 master weights); auto: on CUDA only
    autocast: Autocast = Autocast.auto
    # torch.compile of the drafter forward (block mask included): static compiles one
    # graph per warmed shape, dynamic one symbolic graph; off runs eager
    compile: Compile = Compile.off
    # torch.compile's backend: inductor generates kernels; eager (or aot_eager) runs the
    # same dynamo graphs under the same guards (what warmup and the compile monitor
    # count) without code generation, for checks on a small CPU (the suite uses eager)
    compile_backend: str = "inductor"


@dataclass
class BatchingConfig:
    strategy: Strategy = Strategy.bucketed  # sorted | random | bucketed | megabatch | packed
    token_budget: int = 49152  # padded tokens per batch (per rank)
    max_batch_size: int = 64  # samples per batch at most
    # Windows of this many batches' worth of samples are sorted before packing
    # (megabatch always; bucketed when > 0).
    sort_window: int = 0
    # What happens when batches do not divide evenly over data-parallel ranks:
    # repeat: the first batches of the epoch are repeated to fill the last step;
    # drop: the last batches are dropped (and counted in the report).
    remainder: Remainder = Remainder.repeat
    # Deal each data-parallel step batches of similar cost (fewer stragglers, less
    # within-step length diversity); cost = padded tokens * (1 + attention_cost * length).
    balance_steps: bool = False
    attention_cost: float = 3.7e-5  # per-token attention weight in the step cost
    # packed: rows of row_len tokens (0: data.max_seq_len), token_budget // row_len rows
    # a batch but no more than max_batch_size documents a batch on average, first fit
    # over pack_window open rows (batching/packed_rows.py)
    row_len: int = 0
    pack_window: int = 32  # packed: open rows searched for a fit
    # anchor slots per packed row; 0: as many as the row's documents would get unpacked
    # (packed_rows.anchor_slots_per_row)
    anchors_per_row: int = 0


@dataclass
class BucketsConfig:
    name: str = "seed6"  # the preset's name
    # fixed: use `boundaries`; geometric | quantile | equal_tokens: computed from the data.
    kind: BucketKind = BucketKind.fixed
    boundaries: Optional[List[int]] = None  # kind=fixed: the bucket edges
    num_buckets: int = 6  # computed kinds: how many buckets
    # raise the last boundary to data.max_seq_len + 1, so the top bucket holds every
    # length the data config allows (see batching/boundaries.py resolve_boundaries)
    cover_max_len: bool = True
    # batching=bucketed: a batch size cap per bucket, each <= batching.max_batch_size
    # (`python -m dflash.buckets ... cost=FILE` writes one where smaller batches are
    # predicted faster); null: batching.max_batch_size for every bucket
    max_batch_size: Optional[List[int]] = None
    meta: Dict[str, Any] = field(default_factory=dict)


@dataclass
class WarmupConfig:
    # which planned shapes are warmed before step 1 (every batch then runs at the
    # cheapest warmed shape holding it): none | bucket_max (one per bucket) | top_k (most
    # frequent) | coverage (smallest set covering `coverage` of steps) | all
    policy: WarmupPolicy = WarmupPolicy.all
    pad_to_multiple: int = 64  # padded lengths round up to this (the model group sets it)
    batch_sizes: List[int] = field(default_factory=list)  # a batch-size menu; []: plan's own
    top_k: int = 8  # top_k: warm this many most frequent shapes
    coverage: float = 0.99  # coverage: warm the fewest shapes holding this share of steps
    envelope: bool = True  # top_k / coverage also warm each bucket's envelope shape
    # a compile or autotune run after warmup: warn (counted in summary.json) or stop
    on_compile: OnCompile = OnCompile.warn


@dataclass
class TopologyConfig:
    name: str = "cpu"  # the topology's name
    device: Device = Device.auto  # auto | cpu | cuda
    # data-parallel replicas; each replica runs target stage(s) then drafter stage(s)
    dp_size: int = 1
    # pairs: per local rank, the GPU index of its target and of its drafter (the same
    # index twice: the pair shares one GPU); empty: a GPU each when there are enough
    target_devices: List[int] = field(default_factory=list)
    drafter_devices: List[int] = field(default_factory=list)
    # the CUDA allocator grows segments instead of fragmenting on variable shapes
    expandable_segments: bool = True
    # > 1: each target replica spans this many consecutive ranks, sharded by
    # transformers' tensor-parallel plan (dflash/model/tp_target.py); every rank keeps
    # its own drafter replica and batch. Under torchrun only; must divide the world
    target_tp: int = 1


@dataclass
class PipelineConfig:
    # contexts the target may run ahead of the drafter (a bounded queue); 0: the plain
    # sequential loop (collate, target, drafter in one thread). None: 2 where the target
    # has a GPU (its own, or a CUDA stream on a shared one), 0 where target and drafter
    # share the CPU's cores (a thread per stage would only split them; measured 2.2x
    # slower with both stages running all cores). A depth set on CPU splits the cores.
    depth: Optional[int] = None
    prefetch: int = 2  # batches collated ahead on the host (pinned buffers on GPU)


@dataclass
class LoggerConfig:
    name: str = "none"  # none | wandb (metrics.jsonl is always written)
    project: str = "dflash"  # W&B project
    mode: LoggerMode = LoggerMode.disabled  # W&B mode: online | offline | disabled
    log_every: int = 10  # steps between metric syncs to the host
    progress: bool = True  # the tqdm bar
    group: Optional[str] = None  # W&B group (a multirun's sweep)
    # the gradient norm costs a reduction over every parameter when grad clipping is off
    grad_norm: bool = True
    run_name: Optional[str] = None  # W&B run name (null: from the overrides)


@dataclass
class OptimConfig:
    lr: float = 6e-4  # AdamW peak learning rate
    warmup_ratio: float = 0.04  # linear warmup, share of the steps
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max grad norm (0: off)
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    min_lr_ratio: float = 0.0  # cosine decay floor, share of lr
    max_steps: int = -1  # > 0: stop after this many steps (the schedule spans them)
    # > 0: stop once this many real tokens were trained on (the schedule spans the steps
    # that takes): strategies compared on equal data
    max_tokens: int = -1
    # a NaN/inf loss or gradient: stop (found at the next metric sync, no extra host
    # sync; names the step and samples) or skip the update (one host check per step)
    nonfinite: NonFinite = NonFinite.stop
    max_skips: int = 10  # skip: stop once more steps than this were skipped


@dataclass
class LossConfig:
    """The drafter's objective (`loss=ce|dpace`): a sweep over objectives is one override."""
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
    # strategy re-weights the data its own way). See README.
    norm: LossNorm = LossNorm.plan


@dataclass
class EvalConfig:
    # acceptance length by real speculative decoding on held-out prompts, before and
    # after training; the world's prompts come from a seed stream training never sees
    enabled: bool = True
    num_prompts: int = 16  # held-out prompts decoded
    max_new_tokens: int = 64  # tokens decoded per prompt
    temperature: float = 0.0  # 0: greedy; > 0: sampled (rejection rule)
    batch_size: int = 16  # prompts decoded together
    seed: int = 0  # sampling seed
    every_steps: int = 0  # > 0: also measure during training (eval_curve in summary.json)


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


@dataclass
class CompareConfig:
    # the acceptance length whose wall time (and steps) each strategy of a comparison
    # sweep is judged on; None: the lowest final acceptance of any job (all reach it)
    target_acceptance: Optional[float] = None


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    buckets: BucketsConfig = field(default_factory=BucketsConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    # auto: the newest valid checkpoint in the run dir (fresh start if none); never;
    # or a checkpoint dir / checkpoints dir
    resume: str = "never"
    seed: int = 0  # the run's seed (plan shuffles, drafter init)
    epochs: int = 1  # passes over the data
    # a step cost file (python -m dflash.profile): training logs predicted next to
    # measured step time; refused when measured on other hardware or model sizes
    cost: Optional[str] = None


@dataclass
class ProfileSettings:
    out: str = "cost.json"  # the step cost file plan / buckets / train read (cost=)
    reps: int = 3  # timed repetitions per shape (after one untimed)
    max_shapes: int = 24  # warm shapes profiled (plus anchor and row variants)
    grid: int = 6  # lengths of the token budget's envelope profiled (full and half batches)
    # real training steps that measure what the loop adds to the bare step (0: none)
    calibrate_steps: int = 40
    holdout_every: int = 4  # every 4th point held out to report the fit's error


@dataclass
class ProfileConfig(TrainConfig):
    """The training run's schema plus where and how much to profile."""
    profile: ProfileSettings = field(default_factory=ProfileSettings)


@dataclass
class PlanConfig(TrainConfig):
    """The training run's schema plus the plan app's own keys: every training experiment
    composes with `python -m dflash.plan` and reports the plan that run would train on."""
    # anchor slots of the shape report and the cost prediction; None: the run's
    # model.drafter.num_anchors
    anchors: Optional[int] = None
    lengths_file: Optional[str] = None  # a .npy of lengths instead of data=
    epochs: int = 2  # epochs planned
    seed: int = 0  # the plan's seed
    report: Optional[str] = None  # write the plan report here
    dump: Optional[str] = None  # write the batches here
    plot: Optional[str] = None  # PNG of every run in `report`: efficiency vs mixing


@dataclass
class BucketsAppConfig:
    data: DataConfig = field(default_factory=DataConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    lengths_file: Optional[str] = None  # a .npy of lengths instead of data=
    num_buckets: str = "6"  # an integer or "auto"
    auto_gap: float = 0.02  # auto: stop adding buckets once one saves less than this
    auto_max: int = 32  # auto: at most this many buckets
    quadratic: float = 0.0  # attention's share of the cost, per token squared
    candidates: int = 256  # boundary candidates the optimum is searched over
    # polish the optimum against the exact simulation (batching/bucket_fit/refine.py)
    refine: bool = True
    refine_passes: int = 4

    out: Optional[str] = None  # write the fitted preset (a buckets/ YAML) here
    name: Optional[str] = None  # the preset's name (default: from the file name)
    plot: Optional[str] = None  # a PNG of the lengths and the boundaries
    seed: int = 0  # the simulated plan's seed
    # fit to time instead of padding: a step cost file (python -m dflash.profile); the
    # anchor slots per row (None: the profiled maximum), warmup's length rounding, and
    # a cap on distinct (rows, length) shapes for num_buckets=auto (None: no cap)
    cost: Optional[str] = None
    anchors: Optional[int] = None
    pad_to_multiple: int = 1
    max_shapes: Optional[int] = None
    # with cost=: also fit a batch size cap per bucket (kept only where the exact
    # simulation of the planner predicts it faster; batching/bucket_fit/caps.py)
    fit_caps: bool = True


@dataclass
class RegenBatching:
    token_budget: int = 65536  # prompt + max_new_tokens summed over a batch's rows
    max_batch_size: int = 64  # prompts per batch at most
    # model.compile=static: prompt widths rounded up to this, a bounded set of cache shapes
    pad_to_multiple: int = 64


@dataclass
class OpenAISettings:
    base_url: str = "http://localhost:8000/v1"  # the server's /v1 URL
    model: str = "default"  # the served model's name
    api_key_env: str = "OPENAI_API_KEY"  # the key is read from this variable
    concurrency: int = 16  # requests in flight
    timeout: float = 120.0  # seconds per request
    retries: int = 3  # per request, with the client's backoff


@dataclass
class RegenerateConfig:
    """`python -m dflash.regenerate`: the target writes the replies its drafter learns."""
    inputs: List[str] = MISSING  # chat JSONL files (the formats prepare reads)
    # chat, or a benchmark's own file (gsm8k | humaneval | mtbench: prompt-only records
    # worded as the public DFlash benchmarks prompt them; mtbench wants turns=each)
    format: ChatFormat = ChatFormat.chat
    out: str = MISSING  # chat JSONL written; OUT.parts/ holds the resumable parts
    tokenizer: Optional[str] = None  # None: model.target.path
    model: ModelConfig = field(default_factory=ModelConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    backend: RegenBackend = RegenBackend.local  # local (this process) | openai (a server)
    openai: OpenAISettings = field(default_factory=OpenAISettings)
    turns: RegenTurns = RegenTurns.last  # last | each assistant turn regenerated
    # passed to the chat template (local) or as chat_template_kwargs (server), e.g.
    # {enable_thinking: false} for Qwen3
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0  # nucleus sampling (temperature > 0)
    max_new_tokens: int = 2048  # a reply's length cap (finish_reason length)
    max_seq_len: int = 8192  # prompt + max_new_tokens; longer prompts are skipped
    truncated: TruncatedPolicy = TruncatedPolicy.keep  # a reply that hit max_new_tokens
    bad_lines: BadLines = BadLines.skip  # skip (counted, named) | error
    batching: RegenBatching = field(default_factory=RegenBatching)
    drafter: Optional[str] = None  # a trained dflash drafter: speculative, greedy only
    # greedy decoding without a drafter: plain (one token a step), lookup (prompt-lookup
    # drafts, verified) or auto (whichever gives more tokens/s, measured as it runs)
    decoding: RegenDecoding = RegenDecoding.auto
    seed: int = 0  # sampling seed
    progress: bool = True  # a progress bar


@dataclass
class EvalAppConfig:
    drafter: Optional[str] = None  # a checkpoint dir in the public DFlash layout
    prompts: Optional[str] = None  # JSONL with "prompt_ids", or a dflash data set dir
    # prompt_ids (JSONL of {"prompt_ids": [...]}), or a file of chat | gsm8k | humaneval |
    # mtbench records rendered with the tokenizer's chat template, as the public DFlash
    # benchmarks prompt them (dflash/data/prompt_formats.py)
    format: PromptFormat = PromptFormat.prompt_ids
    tokenizer: Optional[str] = None  # format != prompt_ids; null: model.target.path
    model: ModelConfig = field(default_factory=ModelConfig)
    num_prompts: int = -1  # -1: every prompt in the file
    max_new_tokens: int = 64  # tokens decoded per prompt
    temperature: float = 0.0  # 0: greedy
    batch_size: int = 16  # prompts decoded together
    seed: int = 0  # sampling seed
    device: Device = Device.auto  # auto | cpu | cuda
    out: Optional[str] = None  # JSON report
    # scored on the same prompts, each against the drafter with a paired interval:
    # untrained (a fresh drafter of the same shape) | lookup (prompt lookup) | ngram
    baselines: List[str] = field(default_factory=list)
    ngram_data: Optional[str] = None  # baselines=[ngram]: the data set it counts (training set)


@dataclass
class EndToEndConfig:
    """`python -m dflash.end_to_end`: regenerate -> prepare -> train -> eval on a real model."""
    workdir: str = ".cache/dflash/end_to_end/smollm2"  # every stage's output; reruns skip
    target: Optional[str] = None  # a local HF chat model dir; None: the packaged SmolLM2
    cache_dir: str = ".cache/dflash"  # where the packaged model is converted, once
    prompts: int = 160  # training prompts (dflash.data.prompt_gen, seed 0)
    heldout: int = 24  # eval prompts of the same kinds (seed 1), none in the training set
    max_new_tokens: int = 128  # per regenerated reply
    eval_max_new_tokens: int = 64  # tokens decoded per held-out prompt
    # each app's own keys, nested as in its config (the recipe's CPU defaults live in
    # end_to_end.yaml): train.epochs=16, train.model.drafter.num_layers=2,
    # +train.optim.weight_decay=0.01, +regenerate.batching.max_batch_size=32
    regenerate: Dict[str, Any] = field(default_factory=dict)
    train: Dict[str, Any] = field(default_factory=dict)
    eval: Dict[str, Any] = field(default_factory=dict)


_GROUPS = {
    "data": DataConfig,
    "model": ModelConfig,
    "batching": BatchingConfig,
    "buckets": BucketsConfig,
    "warmup": WarmupConfig,
    "topology": TopologyConfig,
    "logger": LoggerConfig,
    "loss": LossConfig,
}


def safe_dirname(overrides: str, limit: int = 80) -> str:
    """A sweep job's directory name from its overrides: no path separators (they would
    nest directories) and never longer than `limit` (a 55-value list otherwise fails
    with "File name too long"); a cut name keeps a hash of the whole."""
    import hashlib
    name = "".join(c if c.isalnum() or c in "=,.-_+" else "_" for c in str(overrides)) or "run"
    if len(name) > limit:
        name = name[: limit - 9] + "-" + hashlib.sha1(str(overrides).encode()).hexdigest()[:8]
    return name


# outputs/<dir>/DATE/TIME per app config (the app's config name where not listed)
OUT_DIRS = {"train": "runs", "bucket_fit": "buckets"}


def register() -> None:
    """Register the schemas and the sweep-dir resolver (each app calls this once at
    start; importing the library never touches Hydra's global store)."""
    if not OmegaConf.has_resolver("dflash_dirname"):
        OmegaConf.register_new_resolver("dflash_dirname", safe_dirname)
    if not OmegaConf.has_resolver("dflash_outdir"):  # conf/hydra/output/dflash.yaml
        OmegaConf.register_new_resolver("dflash_outdir", lambda app: OUT_DIRS.get(app, app))
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="plan_schema", node=PlanConfig)
    cs.store(name="profile_schema", node=ProfileConfig)
    cs.store(name="regenerate_schema", node=RegenerateConfig)
    cs.store(name="buckets_schema", node=BucketsAppConfig)
    cs.store(name="eval_schema", node=EvalAppConfig)
    cs.store(name="end_to_end_schema", node=EndToEndConfig)
    for group, node in _GROUPS.items():
        cs.store(group=group, name=f"{group}_schema", node=node)


CONF_DIR = Path(__file__).resolve().parent / "conf"  # shipped inside the wheel


def compose(config_name: str = "train", overrides=()):
    """An app's config composed outside a Hydra run (tests, benchmarks, notebooks),
    with the same schemas, groups and override syntax as the command line."""
    from hydra import compose as hydra_compose, initialize_config_dir
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name, list(overrides))
