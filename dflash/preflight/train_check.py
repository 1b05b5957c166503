"""Preflight of `dflash.train`: devices, target and drafter, the data's lengths, the
plan's steps and shapes (or the batching envelope without data), the run dir and what
resume=auto would do, one step's peak memory a device against the GPU, and with
`cost=FILE` the first epoch priced."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from dflash.errors import ConfigError, DataError
from dflash.options import choice
from dflash.preflight.command import Command
from dflash.preflight.common import (Placement, Session, devices_text, dtype_on_gpu,
                                     not_on_cpu, vocab_of, checked_mask, compose, placement,
                                     target_facts)
from dflash.preflight.report import Report
from dflash.preflight.world import World


def check_train(cmd: Command, world: World, session: Session, rep: Report) -> None:
    from dflash.run.identity import check_run_dir
    from dflash.trainer import check_settings
    cfg = compose(cmd)
    check_settings(cfg)  # the real start's first check
    place = placement(cfg.topology, cmd, world)
    tcfg = cfg.model.target
    not_on_cpu(place, world, tcfg.path, "dflash.train")
    dtype_on_gpu(tcfg, place, "train")
    rep.add("devices", devices_text(place, cmd, world))
    hc, text, taps, tok = target_facts(tcfg, place.tp, rep)
    vocab = vocab_of(hc)
    mask = checked_mask(cfg.model.drafter, vocab, tok)
    d = cfg.model.drafter
    if place.gpu and choice(cfg.model.attention) in ("auto", "flex"):
        from dflash.model.masks import check_flex_block_size
        check_flex_block_size(int(d.block_size))
    _heads(d, cfg.loss)
    heads = (f", DSpark heads (Markov rank {d.markov_rank}"
             f"{', confidence' if d.confidence_head else ''})" if d.markov_rank else "")
    layout = ", anchor-first blocks" if d.sample_from_anchor else ""
    rep.add("drafter", f"{d.num_layers} layers x {text.hidden_size}, block {d.block_size}, "
            f"{d.num_anchors} anchors a row, mask id {mask}{heads}{layout}")
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


def _heads(d, loss) -> None:
    """DSpark's heads as the real start checks them (the drafter's build, the objective)."""
    from types import SimpleNamespace

    from dflash.model.dspark import check_heads, check_heads_objective
    check_heads(int(d.markov_rank), bool(d.confidence_head))
    check_heads_objective(SimpleNamespace(markov_rank=int(d.markov_rank),
                                          confidence_head=bool(d.confidence_head)),
                          choice(loss.kind))


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
    from dflash.batching.packed_rows import anchor_slots
    from dflash.batching.run_length import RunLength
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
    # rank 0's first epoch, as the run deals it
    mine = RunLength(planner, 0, place.world_size, b, int(cfg.seed)).shard(0)
    steps = mine.num_batches
    anchors = anchor_slots(planner, anchors, int(b.anchors_per_row))
    compiles = place.gpu or choice(cfg.model.compile) != "off"
    plan = build_shape_plan(plans, cfg.warmup, anchors, compiles)
    run = sorted({plan.run_shape(bs, s) for bs, s in zip(plan.shapes.batch_size.tolist(),
                                                            plan.shapes.seq_len.tolist())})
    rep.add("steps", f"{steps:,} a rank an epoch x {epochs} epochs ({place.world_size} ranks)")
    if cfg.get("cost"):
        rep.add("epoch time", _epoch_time(cfg, plan, mine))
    rep.add("warmup", f"{plan.policy}: {len(plan.warm)} shapes warmed, {len(run)} run shapes")
    by_rows = max(run, key=lambda s: (s.batch_size, s.seq_len))
    by_tokens = max(run, key=lambda s: (s.tokens, s.seq_len))
    return [tuple(s.as_list()) for s in dict.fromkeys([by_rows, by_tokens])]


def _epoch_time(cfg, plan, mine) -> str:
    """`cost=FILE` (a step cost file `dflash.profile` measured on the run's hardware):
    rank 0's first epoch (`mine`), step by step at the shapes it runs at. Only the model
    half of the file's identity is checked: the GPUs are not here."""
    from dflash.batching.step_cost import load_cost_file, predict_steps
    from dflash.warmup.profile import model_identity
    model, doc = load_cost_file(cfg.cost, model_identity(cfg))
    ident = doc["identity"]
    shapes = [plan.run_shape(int(n), int(s)) for n, s in zip(mine.batch_rows, mine.seq_len)]
    pred = predict_steps(model, [x.batch_size for x in shapes], [x.seq_len for x in shapes],
                         [x.anchors for x in shapes])
    extra = (f", {pred['extrapolated_steps']} steps outside the profiled range"
             if pred["extrapolated_steps"] else "")
    sec = pred["total_seconds"]
    return (f"{sec:,.1f} s ({sec / 60:.1f} min) predicted for epoch 0 on "
            f"{ident.get('device', '?')} x {ident.get('device_count', '?')} ({cfg.cost}){extra}")


def _run_dir(cmd: Command) -> str:
    """The run dir the command's Hydra would make; one under a file is refused, as the
    app refuses it."""
    from dflash.errors import check_dir_path
    hcfg = compose(cmd, hydra=True)
    from hydra.core.hydra_config import HydraConfig
    HydraConfig.instance().set_config(hcfg)
    run_dir = str(OmegaConf.select(hcfg, "hydra.run.dir"))
    check_dir_path("hydra.run.dir", run_dir)
    return run_dir


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
