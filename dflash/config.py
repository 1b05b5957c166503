"""The apps' typed schemas, composed from each component's own config section.

Each group's YAML merges into a section dataclass that lives beside the code reading it
(`dflash/batching/config.py`, `dflash/model/config.py`, `TopologyConfig` in
`dflash/topology.py`, ...); the apps' schemas here compose them and are registered with
Hydra's ConfigStore (named first in each app's defaults list), so a misspelled key or a
value of the wrong type fails at start with Hydra's message naming the full key.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

# each section's schema lives beside the code that reads it (a new option touches its
# own package); this module composes them into the apps' schemas and registers them
from dflash.batching.config import BatchingConfig, BucketsConfig
from dflash.comparison.config import CompareConfig
from dflash.data.config import DataConfig
from dflash.eval.config import EvalConfig, PromptFormat
from dflash.generation.config import (BadLines, ChatFormat, OpenAISettings, RegenBackend,
                                      RegenBatching, RegenDecoding, RegenTurns, TruncatedPolicy)
from dflash.loggers import LoggerConfig
from dflash.model.config import DrafterConfig, LossConfig, ModelConfig, TargetConfig
from dflash.optim import OptimConfig
from dflash.dirs import DirsConfig, cache_root
from dflash.pipeline import PipelineConfig
from dflash.resume import CheckpointConfig
from dflash.topology import Device, TopologyConfig
from dflash.warmup.config import WarmupConfig

__all__ = ["BatchingConfig", "BucketsConfig", "CheckpointConfig", "CompareConfig", "DataConfig",
           "DrafterConfig", "EvalConfig", "LoggerConfig", "LossConfig", "ModelConfig",
           "OptimConfig", "PipelineConfig", "TargetConfig", "TopologyConfig", "WarmupConfig",
           "TrainConfig", "PlanConfig", "ProfileConfig", "RegenerateConfig", "EvalAppConfig",
           "EndToEndConfig", "BucketsAppConfig", "compose", "register", "safe_dirname"]


@dataclass
class TrainConfig:
    dirs: DirsConfig = field(default_factory=DirsConfig)
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
    dirs: DirsConfig = field(default_factory=DirsConfig)
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
class RegenerateConfig:
    """`python -m dflash.regenerate`: the target writes the replies its drafter learns."""
    dirs: DirsConfig = field(default_factory=DirsConfig)
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
    # drafter= with a confidence head (DSpark): a block stops at its first draft whose
    # confidence is below this (llama.cpp's --spec-draft-p-min); 0: every draft
    confidence_stop: float = 0.0
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
    dirs: DirsConfig = field(default_factory=DirsConfig)
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
    # a drafter with a confidence head (DSpark): a block stops at its first draft whose
    # confidence is below this (llama.cpp's --spec-draft-p-min); 0: every draft
    confidence_stop: float = 0.0
    device: Device = Device.auto  # auto | cpu | cuda
    # topology.target_tp > 1 (under torchrun): the target sharded over that many ranks,
    # for a target larger than one GPU; otherwise one process on `device`
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    # true: also time greedy decoding at batch 1, plainly and with the drafter, prompt by
    # prompt on this machine: tokens/s of each and the speedup with a 95% interval
    # (dflash/eval/speed.py; the report's `speed`)
    speed: bool = False
    out: Optional[str] = None  # JSON report
    # scored on the same prompts, each against the drafter with a paired interval:
    # untrained (a fresh drafter of the same shape) | lookup (prompt lookup) | ngram |
    # drafter:DIR (another drafter checkpoint tapping the same layers: an A/B)
    baselines: List[str] = field(default_factory=list)
    ngram_data: Optional[str] = None  # baselines=[ngram]: the data set it counts (training set)
    # a data set of held-out prompts + the target's greedy replies (regenerate, prepare):
    # greedy acceptance along every reply for the drafter and the baselines, one target
    # forward per reply (dflash/eval/paths.py); with or without prompts= decoded
    paths: Optional[str] = None


@dataclass
class EndToEndConfig:
    """`python -m dflash.end_to_end`: regenerate -> prepare -> train -> eval on a real model."""
    dirs: DirsConfig = field(default_factory=DirsConfig)
    workdir: str = "${dirs.cache}/end_to_end/smollm2"  # every stage's output; reruns skip
    target: Optional[str] = None  # a local HF chat model dir; None: the packaged SmolLM2
    cache_dir: str = "${dirs.cache}"  # where the packaged model is converted, once
    prompts: int = 1200  # training prompts (dflash.recipe.prompt_gen, seed 0), all distinct
    heldout: int = 48  # eval prompts of the same kinds (seed 1) on subjects of their own
    # more held-out prompts (seed 2) whose greedy replies the comparison walks (paths
    # stage: one target forward a reply; 0: no such stage)
    paths: int = 480
    max_new_tokens: int = 128  # per regenerated reply
    eval_max_new_tokens: int = 64  # tokens decoded per held-out prompt
    # before the long stages: the recipe's apps on `estimate_prompts` prompts, and
    # regenerate + train priced on this machine from their rates (dflash/recipe/estimate.py)
    estimate: bool = True
    estimate_prompts: int = 16
    # minutes regenerate + train may take by that estimate: prompts and paths are scaled
    # down together to fit (the recipe prints what it scaled); None: the counts as given
    budget_minutes: Optional[float] = None
    # a llama.cpp source tree with DFlash support and build/bin/llama-server: the last
    # stage serves the drafter there and compares tokens and acceptance with dflash's;
    # None: $LLAMA_CPP_DIR if set, else the stage is skipped
    llama_cpp: Optional[str] = None
    # with llama_cpp: llama-server's decoding speed, no speculation / its n-gram modes /
    # the trained and an untrained drafter, at 1 and 4 concurrent requests (speed.json)
    speed: bool = True
    # each app's own keys, nested as in its config, and under `groups` its config group
    # choices (the recipe's CPU defaults live in end_to_end.yaml): train.epochs=16,
    # train.model.drafter.num_layers=2, train.groups.loss=ce,
    # +regenerate.batching.max_batch_size=32 (dflash/recipe/stage_config.py)
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
    "dirs": DirsConfig,
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


_CLASH_SAID = False  # the import-clash line, once a process

# outputs/<dir>/DATE/TIME per app config (the app's config name where not listed)
OUT_DIRS = {"train": "runs", "bucket_fit": "buckets"}


def check_import_clash() -> str | None:
    """The public reference drafter package ("dflash" on PyPI) imports as `dflash` too:
    installed beside this one (distribution "dflash-trainer"), one shadows the other.
    A line saying so (printed once by every app at start), or None."""
    from importlib import metadata
    try:
        other = metadata.distribution("dflash")
    except metadata.PackageNotFoundError:
        return None
    try:
        ours = metadata.distribution("dflash-trainer")
    except metadata.PackageNotFoundError:
        ours = None
    here = Path(__file__).resolve().parents[1]
    if ours is None or '"editable": true' in (other.read_text("direct_url.json") or "") \
            or Path(str(other.locate_file(""))).resolve() == here:
        return None  # an editable "dflash", or its egg-info: this checkout's former name
    return (f"dflash: warning: the package 'dflash' {other.version} (the public reference "
            f"drafter, PyPI) is installed beside this project's 'dflash-trainer' "
            f"{ours.version}; both import as `dflash` and one shadows the other: "
            "pip uninstall dflash")


def register() -> None:
    """Register the schemas and the sweep-dir resolver (each app calls this once at
    start; importing the library never touches Hydra's global store). The schemas are
    stored once a process: storing converts every dataclass again (~0.1 s, half of a
    `compose`), and preflight and the recipe compose dozens of configs."""
    global _CLASH_SAID
    if not _CLASH_SAID:
        _CLASH_SAID = True
        line = check_import_clash()
        if line:
            import sys
            print(line, file=sys.stderr)
    if not OmegaConf.has_resolver("dflash_dirname"):
        OmegaConf.register_new_resolver("dflash_dirname", safe_dirname)
    if not OmegaConf.has_resolver("dflash_name"):  # a path's last part (run dir names)
        OmegaConf.register_new_resolver(
            "dflash_name", lambda p: safe_dirname(Path(str(p)).name) if p else "in-memory")
    if not OmegaConf.has_resolver("dflash_drafter_layers"):  # experiment=production's depth
        from dflash.model.derive import drafter_layers
        OmegaConf.register_new_resolver("dflash_drafter_layers", drafter_layers)
    if not OmegaConf.has_resolver("dflash_cache"):  # dirs.cache: $DFLASH_CACHE or the default
        OmegaConf.register_new_resolver("dflash_cache", lambda: str(cache_root()))
    if not OmegaConf.has_resolver("dflash_outdir"):  # conf/hydra/output/dflash.yaml
        OmegaConf.register_new_resolver("dflash_outdir", lambda app: OUT_DIRS.get(app, app))
    cs = ConfigStore.instance()
    if cs.repo.get("train_schema.yaml") is not None:  # stored together, once
        return
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
