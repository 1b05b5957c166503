"""Every check a real start runs, without a GPU and without weights.

For each app the command's config is composed exactly as the app would compose it (the
same overrides, the torchrun environment of its world), then checked the way its start
checks it: topology and process count, TP against the target's heads, taps against its
depth, the mask token against its vocabulary and tokenizer, the data's lengths against
`data.max_seq_len`, the warm shape set, the run dir and what `resume=auto` would do, and
(train) one step's peak memory a device against the world's GPUs. A failure is the one
line the real start would print.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from dflash.errors import ConfigError, DataError, TopologyError, UserError
from dflash.options import choice
from dflash.preflight.command import Command
from dflash.preflight.report import Report
from dflash.preflight.target_files import read_config, read_tokenizer
from dflash.preflight.world import World, launched

APP_CONFIG = {"dflash.train": "train", "dflash.regenerate": "regenerate", "dflash.eval": "eval",
              "dflash.plan": "plan", "dflash.profile": "profile", "dflash.buckets": "bucket_fit",
              "dflash.end_to_end": "end_to_end"}


@dataclass
class Session:
    """Commands checked in order, as a guide runs them: a prepare's output is the next
    train's data (its length limit is known before the data exists); memory estimates
    are reused for the same model and shape."""
    produced: dict = field(default_factory=dict)  # path -> what writes it ({} for a preset)
    estimates: dict = field(default_factory=dict)


def check(cmd: Command, world: World, session: Session | None = None) -> Report:
    session = session or Session()
    rep = Report(cmd.text, str(world), app=cmd.module)
    try:
        if world.has_gpu and cmd.nnodes > world.nodes:
            raise TopologyError(f"the command starts {cmd.nnodes} nodes (torchrun --nnodes), "
                                f"the world has {world.nodes}")
        with launched(cmd.nproc_per_node, cmd.nnodes, cmd.env):
            CHECKS.get(cmd.module, _compose_only)(cmd, world, session, rep)
    except UserError as exc:
        rep.refused = str(exc)
    except Exception as exc:  # noqa: BLE001  Hydra's composition errors: one line each
        if type(exc).__module__.split(".")[0] not in ("hydra", "omegaconf"):
            raise
        line = " ".join(str(exc).split())
        missing = re.search(r"Could not find '([^']+)'", line)
        made = missing and next((p for p in session.produced
                                 if p.endswith(f"{missing[1]}.yaml")), None)
        if made:  # a preset an earlier command of the guide writes
            rep.unchecked.append(f"{made} is written by an earlier command; not here yet")
        else:
            rep.refused = line
    return rep


def compose(cmd: Command, hydra: bool = False):
    from dflash.config import compose as dflash_compose, register
    from hydra import compose as hydra_compose, initialize_config_dir
    from dflash.config import CONF_DIR
    overrides = _first_of_sweeps(cmd.overrides) if cmd.multirun else cmd.overrides
    if not hydra:
        return dflash_compose(APP_CONFIG[cmd.module], overrides)
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(APP_CONFIG[cmd.module], overrides, return_hydra_config=True)


def _first_of_sweeps(overrides: list) -> list:
    """A --multirun's first job: `k=a,b` -> `k=a` (each job is checked alike)."""
    return [o.split("=", 1)[0] + "=" + o.split("=", 1)[1].split(",")[0]
            if "," in o.split("=", 1)[1] and "[" not in o else o for o in overrides]


def _compose_only(cmd, world, session, rep) -> None:
    if cmd.module not in APP_CONFIG:
        return
    compose(cmd)
    rep.add("config", f"{APP_CONFIG[cmd.module]} composes")


# ---- topology ---------------------------------------------------------------------
@dataclass
class Placement:
    gpu: bool
    world_size: int
    tp: int
    shared: bool  # target and drafter on one device


def placement(topo_cfg, cmd: Command, world: World) -> Placement:
    from dflash.topology import check_dp_size, check_target_tp, pair_devices
    n = cmd.world_size
    dev = choice(topo_cfg.device)
    if dev == "cuda" and not world.has_gpu:
        raise TopologyError("topology.device=cuda but the world has no GPU (use topology=cpu)")
    gpu = dev == "cuda" or (dev == "auto" and world.has_gpu)
    if "dp_size" in topo_cfg:
        check_dp_size(topo_cfg, n)
    tp = check_target_tp(topo_cfg, n)
    shared = True
    if gpu:
        gpus = world.gpus_per_node
        if tp == 1 and (n > 1 or topo_cfg.get("target_devices")):
            pairs = [pair_devices(topo_cfg, r, cmd.nproc_per_node, gpus)
                     for r in range(cmd.nproc_per_node)]
            shared = pairs[0][0] == pairs[0][1]
        elif cmd.nproc_per_node > gpus:
            raise TopologyError(f"{cmd.nproc_per_node} processes a node, {gpus} GPUs a node")
    return Placement(gpu, n, tp, shared)


def _not_on_cpu(place: Placement, world: World, target_path, app: str) -> None:
    """A real target on the CPU of a GPU machine is a silent 100x: refused."""
    if world.has_gpu and not place.gpu and target_path:
        raise TopologyError(f"{app} would run the target ({target_path}) on CPU although the "
                            f"world has GPUs (topology.device=cpu): add topology=single_gpu, "
                            "or topology=pairs under torchrun")


# ---- the target ---------------------------------------------------------------------
def target_facts(tcfg, tp: int, rep: Report):
    """(HF config, text config, tapped layers, tokenizer) of model.target."""
    from dflash.model.target import checked_layer_ids, tiny_qwen3_config
    path = tcfg.get("path")
    hc = tiny_qwen3_config(tcfg) if not path else read_config(path)
    text = hc.get_text_config() if hasattr(hc, "get_text_config") else hc
    taps = checked_layer_ids(list(tcfg.layer_ids) if tcfg.get("layer_ids") else None,
                             int(text.num_hidden_layers))
    if tp > 1:
        from dflash.model.tp_target import check_tp
        check_tp(path, tp)
    tok = read_tokenizer(path) if path else None
    rep.add("target", f"{type(text).__name__.replace('Config', '')} {path or '(in memory)'}: "
            f"{text.num_hidden_layers} layers x {text.hidden_size}, vocab "
            f"{_vocab(hc)}, {tcfg.dtype}" + (f", TP {tp}" if tp > 1 else ""))
    rep.add("taps", taps)
    return hc, text, taps, tok


def _vocab(hc) -> int:
    text = hc.get_text_config() if hasattr(hc, "get_text_config") else hc
    return int(getattr(hc, "vocab_size", None) or text.vocab_size)


def checked_mask(drafter_cfg, vocab: int, tok) -> int:
    """The mask id the real start picks, refused where it is a token text renders."""
    from dflash.data.mask_token import default_mask_token, rendered_tokens
    from dflash.model.drafter import mask_token_id
    mask = mask_token_id(drafter_cfg, vocab, default_mask_token(vocab, tok))
    if tok is not None and drafter_cfg.mask_token_id is not None:
        added = getattr(tok, "added_tokens_decoder", {})
        if mask in rendered_tokens(tok):
            what = f" ({added[mask].content!r})" if mask in added else ""
            raise ConfigError(f"model.drafter.mask_token_id={mask}{what} is a token the chat "
                              "template renders; leave it null (an unused special token of "
                              "this tokenizer is chosen)")
        if mask < len(tok) and mask not in added:
            raise ConfigError(f"model.drafter.mask_token_id={mask} is a word this tokenizer "
                              "emits; leave it null (an unused special token is chosen)")
    return mask


# ---- train ----------------------------------------------------------------------------
def check_train(cmd: Command, world: World, session: Session, rep: Report) -> None:
    from dflash.resume_identity import check_run_dir
    cfg = compose(cmd)
    place = placement(cfg.topology, cmd, world)
    tcfg = cfg.model.target
    _not_on_cpu(place, world, tcfg.path, "dflash.train")
    _dtype_on_gpu(tcfg, place, "train")
    rep.add("devices", _devices_text(place, cmd, world))
    hc, text, taps, tok = target_facts(tcfg, place.tp, rep)
    vocab = _vocab(hc)
    mask = checked_mask(cfg.model.drafter, vocab, tok)
    d = cfg.model.drafter
    if place.gpu and choice(cfg.model.attention) in ("auto", "flex"):
        from dflash.model.masks import check_flex_block_size
        check_flex_block_size(int(d.block_size))
    rep.add("drafter", f"{d.num_layers} layers x {text.hidden_size}, block {d.block_size}, "
            f"{d.num_anchors} anchors a row, mask id {mask}")
    lengths = _train_lengths(cfg, session, rep, vocab, mask)
    shapes = _shapes(cfg, lengths, place, rep)
    run_dir = _run_dir(cmd)
    rep.add("run dir", run_dir)
    check_run_dir(cfg, Path(run_dir))
    rep.add("resume", _resume_text(cfg, Path(run_dir)))
    if place.gpu:
        _memory(cfg, hc, shapes, place, world, session, rep, mask)
    else:
        rep.unchecked.append("memory: a CPU world (the estimate is for GPU devices)")


def _devices_text(place: Placement, cmd: Command, world: World) -> str:
    if not place.gpu:
        return f"{place.world_size} process(es) on CPU"
    kind = ("one GPU each (target shard + drafter)" if place.tp > 1 else
            "target and drafter share a GPU" if place.shared else "a target GPU and a drafter GPU")
    groups = f", {place.world_size // place.tp} TP groups of {place.tp}" if place.tp > 1 else ""
    return (f"{cmd.nnodes} node(s) x {cmd.nproc_per_node} processes = {place.world_size} "
            f"ranks, {kind}{groups}")


def _train_lengths(cfg, session: Session, rep: Report, vocab: int, mask: int):
    """The training samples' lengths where the data is at hand (None otherwise), after
    the checks the real start runs on them."""
    from dflash.data.build import load_data
    src, path = choice(cfg.data.source), cfg.data.get("path")
    if src == "tokenized" and path and not Path(path).exists():
        made = session.produced.get(str(Path(path))) or {}
        if made.get("max_seq_len", 0) > int(cfg.data.max_seq_len):
            raise DataError(f"{path}: prepare keeps samples of up to {made['max_seq_len']} "
                            f"tokens (--max-seq-len), more than data.max_seq_len="
                            f"{cfg.data.max_seq_len}; prepare with --max-seq-len "
                            f"{cfg.data.max_seq_len}")
        if made.get("tokenizer") and not cfg.model.target.path:
            raise DataError(f"{path} holds {made['tokenizer']}'s token ids and the target is "
                            "the in-memory tiny model (model.target.path unset): train its "
                            f"own drafter with model=hf model.target.path={made['tokenizer']}")
        rep.unchecked.append(f"data: {path} is not here (lengths, steps and shapes from the "
                             "batching limits instead)")
        return None
    if src == "world":
        vocab = int(cfg.data.vocab_size)
    data = load_data(cfg.data, need_tokens=src == "tokenized")
    if data.dataset is not None:
        data.dataset.check_vocab(vocab)
        data.dataset.check_absent(mask, "model.drafter.mask_token_id")
    lengths = data.lengths
    held = int(cfg.eval.num_prompts) if cfg.eval.enabled and src != "world" else 0
    if held >= len(lengths):
        raise ConfigError(f"eval.num_prompts={held} leaves no training samples of {len(lengths)}")
    lengths = lengths[:len(lengths) - held]
    rep.add("data", f"{len(lengths):,} samples, {int(lengths.sum()):,} tokens, longest "
            f"{int(lengths.max()):,} (data.max_seq_len {cfg.data.max_seq_len})")
    return lengths


def _shapes(cfg, lengths, place: Placement, rep: Report) -> list:
    """The shapes one step may run at, largest first: from the warm set where the data is
    here, else the envelope the batching limits allow."""
    from dflash.batching.distributed import shard
    from dflash.batching.packed_rows import anchor_slots_per_row
    from dflash.batching.strategies import planner_for
    from dflash.warmup.shapes import build_shape_plan
    anchors = int(cfg.model.drafter.num_anchors)
    b = cfg.batching
    if lengths is None:
        budget, rows = int(b.token_budget), int(b.max_batch_size)
        step = int(cfg.warmup.pad_to_multiple)
        longest = int(cfg.data.max_seq_len)
        env = [(rows, max(step, budget // rows // step * step)),
               (max(1, budget // longest), longest)]
        rep.add("shapes", f"envelope (no data): rows x length {env[0]} and {env[1]}")
        return [(r, s, anchors) for r, s in env]
    _, planner = planner_for(cfg, lengths)
    epochs = max(1, int(cfg.epochs))
    plans = [planner.epoch(e) for e in range(epochs)]
    steps = shard(plans[0], 0, place.world_size, choice(b.remainder), bool(b.balance_steps),
                  float(b.attention_cost), int(cfg.seed)).num_batches
    if planner.packs_rows:
        anchors = anchor_slots_per_row(lengths, anchors, planner.spec.row_len,
                                       int(b.anchors_per_row))
    compiles = place.gpu or choice(cfg.model.compile) != "off"
    plan = build_shape_plan(plans, cfg.warmup, anchors, compiles)
    run = sorted({plan.run_shape(bs, s) for bs, s in zip(plan.shapes.batch_size.tolist(),
                                                            plan.shapes.seq_len.tolist())})
    rep.add("steps", f"{steps:,} a rank an epoch x {epochs} epochs ({place.world_size} ranks)")
    if cfg.get("cost"):
        rep.add("epoch time", _epoch_time(cfg, plan, plans[0], place))
    rep.add("warmup", f"{plan.policy}: {len(plan.warm)} shapes warmed, {len(run)} run shapes")
    by_rows = max(run, key=lambda s: (s.batch_size, s.seq_len))
    by_tokens = max(run, key=lambda s: (s.tokens, s.seq_len))
    return [tuple(s.as_list()) for s in dict.fromkeys([by_rows, by_tokens])]


def _epoch_time(cfg, plan, epoch0, place: Placement) -> str:
    """`cost=FILE` (a step cost file `dflash.profile` measured on the run's hardware):
    rank 0's first epoch, step by step at the shapes it runs at."""
    from dflash.batching.distributed import shard
    from dflash.batching.step_cost import MODEL_FIELDS, load_cost_file, predict_steps
    from dflash.warmup.profile import model_identity
    model, doc = load_cost_file(cfg.cost)
    ident, here = doc["identity"], model_identity(cfg)
    differ = [k for k in MODEL_FIELDS if k in ident and k in here and ident[k] != here[k]]
    if differ:
        raise DataError(f"cost file {cfg.cost}: {differ[0]} is {ident[differ[0]]!r} there but "
                        f"{here[differ[0]]!r} in this run; profile this setup first")
    b = cfg.batching
    mine = shard(epoch0, 0, place.world_size, choice(b.remainder), bool(b.balance_steps),
                 float(b.attention_cost), int(cfg.seed))
    shapes = [plan.run_shape(int(n), int(s)) for n, s in zip(mine.batch_rows, mine.seq_len)]
    pred = predict_steps(model, [x.batch_size for x in shapes], [x.seq_len for x in shapes],
                         [x.anchors for x in shapes])
    extra = (f", {pred['extrapolated_steps']} steps outside the profiled range"
             if pred["extrapolated_steps"] else "")
    sec = pred["total_seconds"]
    return (f"{sec:,.1f} s ({sec / 60:.1f} min) predicted for epoch 0 on "
            f"{ident.get('device', '?')} x {ident.get('device_count', '?')} ({cfg.cost}){extra}")


def _run_dir(cmd: Command) -> str:
    hcfg = compose(cmd, hydra=True)
    from hydra.core.hydra_config import HydraConfig
    HydraConfig.instance().set_config(hcfg)
    return str(OmegaConf.select(hcfg, "hydra.run.dir"))


def _resume_text(cfg, run_dir: Path) -> str:
    if str(cfg.resume) != "auto":
        return f"resume={cfg.resume}"
    steps = sorted((run_dir / "checkpoints").glob("step-*"))
    if steps:
        return f"resume=auto continues this run from {steps[-1].name}"
    return "resume=auto: nothing there yet, a fresh start"


def _memory(cfg, hc, shapes, place: Placement, world: World, session: Session,
            rep: Report, mask: int) -> None:
    """One step's peak per device at the run's largest shapes against the world's GPUs;
    refused with what would make it fit."""
    import torch
    from dflash.pipeline import default_depth
    on = choice(cfg.model.autocast) in ("auto", "native", "bf16", "bfloat16")  # bf16 on CUDA
    cfg = OmegaConf.merge(cfg, {"model": {"autocast": "bf16" if on else "off"}})
    depth = cfg.pipeline.get("depth")
    depth = default_depth(torch.device("cuda"), torch.device("cuda")) if depth is None else int(depth)
    worst = max((_estimate(session, hc, cfg, shape, place, depth, mask) for shape in shapes),
                key=lambda e: e.peak_gib)
    rep.memory, rep.limit_gib = worst, world.usable_gib
    if worst.peak_gib <= world.usable_gib:
        return
    where = max(worst.per_device(), key=worst.per_device().get)
    rows, length, anchors = worst.shape
    fix = _micro_rows_that_fit(session, hc, cfg, worst, place, depth, mask, world.usable_gib)
    raise ConfigError(
        f"one step needs {worst.peak_gib:.1f} GiB on the {where} device at rows x length x "
        f"anchors {rows} x {length} x {anchors}, {world.usable_gib:.1f} GiB usable of "
        f"{world.gpu_gib:g}: {fix}")


def _estimate(session: Session, hc, cfg, shape, place: Placement, depth: int, mask: int):
    from dflash.preflight.memory import estimate
    key = (repr(hc.to_dict()), OmegaConf.to_yaml(cfg.model), OmegaConf.to_yaml(cfg.loss),
           int(cfg.optim.micro_rows), tuple(shape), place.tp, place.shared, depth)
    if key not in session.estimates:
        session.estimates[key] = estimate(hc, cfg, *shape, mask_token_id=mask, tp=place.tp,
                                          shared=place.shared, queue_depth=depth)
    return session.estimates[key]


def _micro_rows_that_fit(session, hc, cfg, worst, place, depth, mask, limit: float) -> str:
    """What to change: the largest optim.micro_rows whose estimate fits (the drafter's
    activations grow with the rows a forward takes), else the anchors or TP."""
    rows = worst.shape[0]
    per_device = worst.per_device()
    target_side = per_device.get("target", 0.0) > limit
    if not target_side and rows > 1:
        one = _estimate(session, hc, OmegaConf.merge(cfg, {"optim": {"micro_rows": 1}}),
                        worst.shape, place, depth, mask)
        now = min(rows, int(cfg.optim.micro_rows) or rows)
        per_row = (worst.peak_gib - one.peak_gib) / max(1, now - 1)
        fits = int((limit - one.peak_gib) // per_row) + 1 if per_row > 0 else 0
        if fits >= 1 and one.peak_gib <= limit:
            fits = 1 << (min(fits, rows).bit_length() - 1)  # a power of two: even slices
            return (f"set optim.micro_rows={fits} (the drafter takes {fits} row(s) at a time, "
                    f"the same step; ~{one.peak_gib + (fits - 1) * per_row:.1f} GiB)")
    return ("lower model.drafter.num_anchors (the drafter's activations grow with rows x "
            "anchors), batching.token_budget (the target's), or shard the target "
            "(topology.target_tp)")


# ---- regenerate and eval: the target decoding ------------------------------------------
def _decode_memory(hc, dtype: str, tokens: int, tp: int) -> float:
    """GiB of one decoding rank: weights / tp + the KV cache of `tokens` tokens."""
    text = hc.get_text_config() if hasattr(hc, "get_text_config") else hc
    width = 2 if dtype in ("bfloat16", "float16") else 4
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    layers, h = int(text.num_hidden_layers), int(text.hidden_size)
    inter = int(getattr(text, "intermediate_size", 4 * h))
    experts = int(getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None) or 1)
    moe_inter = int(getattr(text, "moe_intermediate_size", None) or inter)
    mlp = 3 * h * (moe_inter * experts if experts > 1 else inter)
    attn = h * head_dim * (2 * text.num_attention_heads + 2 * text.num_key_value_heads)
    params = layers * (mlp + attn) + 2 * _vocab(hc) * h
    kv = 2 * layers * text.num_key_value_heads * head_dim * tokens
    return (params / tp + kv / tp) * width / float(1 << 30)


def check_regenerate(cmd: Command, world: World, session: Session, rep: Report) -> None:
    cfg = compose(cmd)
    if choice(cfg.backend) == "openai":  # a server decodes: its tokenizer is all read here
        tok = cfg.tokenizer or cfg.model.target.path
        if not tok:
            raise ConfigError("regenerate needs a tokenizer: set tokenizer=DIR or model.target.path")
        if Path(tok).exists() and read_tokenizer(tok) is None:
            raise DataError(f"tokenizer={tok}: no tokenizer files there")
        rep.add("backend", f"openai at {cfg.openai.base_url} ({cfg.openai.model})")
        return
    place = placement(cfg.topology, cmd, world)
    _not_on_cpu(place, world, cfg.model.target.path, "dflash.regenerate")
    rep.add("devices", _devices_text(place, cmd, world))
    hc, *_ = target_facts(cfg.model.target, place.tp, rep)
    _dtype_on_gpu(cfg.model.target, place, "regenerate")
    tokens = int(cfg.batching.token_budget)
    _decode_fits(hc, cfg.model.target, tokens, place, world, rep,
                 "batching.token_budget (prompt + max_new_tokens, a batch)")


def check_eval(cmd: Command, world: World, session: Session, rep: Report) -> None:
    cfg = compose(cmd)
    if int(cfg.topology.target_tp) > 1:  # a target over a TP group of GPUs
        place = placement(cfg.topology, cmd, world)
    else:
        dev = choice(cfg.device)
        place = Placement(dev == "cuda" or (dev == "auto" and world.has_gpu), 1, 1, True)
    _not_on_cpu(place, world, cfg.model.target.path, "dflash.eval")
    hc, *_ = target_facts(cfg.model.target, place.tp, rep)
    _dtype_on_gpu(cfg.model.target, place, "eval")
    if cfg.drafter and not Path(cfg.drafter).exists():
        rep.unchecked.append(f"drafter: {cfg.drafter} is not here")
    tokens = int(cfg.batch_size) * (int(cfg.max_new_tokens) + 2048)
    _decode_fits(hc, cfg.model.target, tokens, place, world, rep,
                 "batch_size x (prompt + max_new_tokens)")


def _dtype_on_gpu(tcfg, place: Placement, app: str) -> None:
    if place.gpu and str(tcfg.dtype) in ("auto", "native"):
        tcfg.dtype = "bfloat16"  # what the app resolves it to on CUDA
    if place.gpu and str(tcfg.dtype) == "float32" and tcfg.path:
        raise ConfigError(f"{app} would run the target in float32 on GPU (model.target.dtype): "
                          "set model.target.dtype=bfloat16 (the training recipe's precision)")


def _decode_fits(hc, tcfg, tokens: int, place: Placement, world: World, rep: Report,
                 what: str) -> None:
    if not place.gpu:
        return
    gib = _decode_memory(hc, str(tcfg.dtype), tokens, place.tp)
    rep.decode_gib = gib
    rep.add("decode memory", f"{gib:.1f} GiB a device (weights + KV cache of {tokens:,} tokens)")
    rep.limit_gib = world.usable_gib
    if gib > world.usable_gib:
        raise ConfigError(f"the target and its KV cache need {gib:.1f} GiB a device, "
                          f"{world.usable_gib:.1f} usable of {world.gpu_gib:g}: lower {what}"
                          + ("" if place.tp > 1 else " or shard the target (topology.target_tp)"))


# ---- prepare ----------------------------------------------------------------------------
def check_prepare(cmd: Command, world: World, session: Session, rep: Report) -> None:
    from dflash.data.prepare import parser
    try:
        args = parser().parse_args(cmd.args)
    except SystemExit:
        raise ConfigError(f"dflash.data.prepare: cannot parse {' '.join(cmd.args)}") from None
    tok = Path(args.tokenizer)
    if tok.exists() and read_tokenizer(tok) is None:
        raise DataError(f"--tokenizer {tok}: no tokenizer files there")
    session.produced[str(Path(args.out))] = {"max_seq_len": int(args.max_seq_len),
                                             "tokenizer": args.tokenizer}
    rep.add("writes", f"{args.out}: samples up to {args.max_seq_len} tokens ({args.overlong})")


def check_buckets(cmd: Command, world: World, session: Session, rep: Report) -> None:
    cfg = compose(cmd)
    if cfg.get("out"):
        session.produced[str(Path(str(cfg.out)))] = {}
        rep.add("writes", cfg.out)


CHECKS = {"dflash.buckets": check_buckets, "dflash.train": check_train, "dflash.regenerate": check_regenerate,
          "dflash.eval": check_eval, "dflash.data.prepare": check_prepare}

