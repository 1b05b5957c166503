"""What a training run reads: the data set, the frozen target and held-out eval prompts.

`data=world` (the CPU default) fits its own tiny target and writes target-consistent
data (see `dflash.sources.world`); every other source uses the configured target as is and
holds out the last `eval.num_prompts` samples, whose prompts (the tokens before the
first supervised one) training never sees.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from dflash.options import choice
from dflash.data.build import Data, load_data
from dflash.data.mask_token import default_mask_token
from dflash.data.overlong import apply_to_lengths
from dflash.data.synthetic import synthetic_lengths
from dflash.errors import ConfigError, DataError
from dflash.model.drafter import mask_token_id
from dflash.model.target import Target, target_vocab_size

log = logging.getLogger("dflash.sources")


@dataclass
class Sources:
    data: Data  # what the planner sees (held-out samples excluded)
    target: Target
    eval_prompts: list  # 1-D int arrays
    target_dir: str | None = None  # where the target's HF files are (None: built in memory)
    mask_token_id: int = 0  # the drafter's mask token, checked absent from the data


def _world(cfg, progress: bool, load_target) -> Sources:
    from dflash.sources.world import World, held_out_prompts, load_world

    d = cfg.data
    raw = synthetic_lengths(d.num_samples, d.length_scale, d.min_length, d.seed)
    lengths, _, report = apply_to_lengths(raw, d.max_seq_len, choice(d.overlong), "world data")
    world = load_world(d, cfg.model.target, lengths, progress=progress)
    tcfg = OmegaConf.merge(cfg.model.target, {"path": str(world.target_dir)})
    target = load_target(tcfg)
    n_eval = int(cfg.eval.num_prompts)
    eval_lengths = synthetic_lengths(max(1, n_eval), d.length_scale, d.min_length, d.seed + 1)
    prompts = held_out_prompts(World(int(d.vocab_size), int(d.period), int(d.slot_size)),
                               eval_lengths, d.seed)[:n_eval]
    info = {"source": "world", "num_samples": len(lengths), **report.as_dict(),
            "target_dir": str(world.target_dir), "path": str(world.dataset.path),
            **{k: world.dataset.meta[k] for k in ("target_rewritten_samples",
                                                   "target_unsettled_samples")}}
    mask = checked_mask_token(cfg, world.dataset, int(cfg.model.target.vocab_size), None)
    return Sources(Data(lengths, world.dataset, info), target, prompts, str(world.target_dir), mask)


def _data_tokenizer(dataset, target_path):
    """The tokenizer the data set was prepared with (its meta.json names it), else the
    target's directory's; None when neither loads (synthetic sets have none)."""
    from dflash.data.prepare import load_tokenizer
    for where in (dataset.meta.get("tokenizer"), target_path):
        if where and Path(where).is_dir():
            try:
                return load_tokenizer(where)
            except (DataError, OSError, ValueError):
                continue
    return None


def checked_mask_token(cfg, dataset, vocab: int, tok) -> int:
    """The drafter's mask token (`model.drafter.mask_token_id`, else a row `tok` never
    emits), refused when the data set holds it, naming the sample."""
    mask = mask_token_id(cfg.model.drafter, vocab, default_mask_token(vocab, tok))
    dataset.check_absent(mask, "model.drafter.mask_token_id")
    return mask


def prompt_of(tokens: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """The tokens before the first supervised one (at least one token)."""
    sup = np.flatnonzero(loss_mask)
    return np.asarray(tokens[:max(1, int(sup[0]) if len(sup) else len(tokens))], dtype=np.int64)


def sources_for_ranks(cfg, topo) -> Sources:
    """A training run's sources on every rank of `topo`: rank 0 builds (and caches) the
    data and fitted target first; the others then read its cache instead of racing to
    write the same files. Under target_tp every rank of a group loads its shard together
    (the load talks)."""
    dist, tp = topo.distributed, topo.tp_size > 1
    deferred = []
    if dist and not topo.is_main:
        torch.distributed.barrier()
    sources = build_sources(cfg, progress=topo.is_main, load_target=deferred.append if tp else None)
    if dist and topo.is_main:
        torch.distributed.barrier()
    if tp:
        from dflash.model.tp_target import TensorParallelTarget
        sources.target = TensorParallelTarget.load(deferred[0], topo.tp_mesh)
    return sources


def build_sources(cfg, progress: bool = True, load_target=None) -> Sources:
    """`load_target(target_cfg)`: how the target is loaded (default Target.from_config;
    a tensor-parallel run defers it until every rank of its group can load together)."""
    load_target = load_target or Target.from_config
    if choice(cfg.data.source) == "world":
        return _world(cfg, progress, load_target)
    vocab = target_vocab_size(cfg.model.target)  # a bad model path fails before data work
    data = load_data(cfg.data, need_tokens=True)
    if data.dataset is None:
        raise DataError("training needs token data: data.source=lengths only plans "
                        "(use data=world, synthetic or tokenized)")
    data.dataset.check_vocab(vocab)
    tok = (_data_tokenizer(data.dataset, cfg.model.target.path)
           if cfg.model.drafter.mask_token_id is None else None)
    mask = checked_mask_token(cfg, data.dataset, vocab, tok)
    n_eval = int(cfg.eval.num_prompts) if cfg.eval.enabled else 0
    if n_eval >= len(data.lengths):
        raise ConfigError(f"eval.num_prompts={n_eval} leaves no training samples of "
                        f"{len(data.lengths)}")
    keep = len(data.lengths) - n_eval
    if n_eval:
        log.info("data: the last %d of %d samples are held out as eval prompts "
                 "(eval.num_prompts; training never sees them): %d train", n_eval,
                 len(data.lengths), keep)
    prompts = [prompt_of(*data.dataset.sample(i)) for i in range(keep, len(data.lengths))]
    data = Data(data.lengths[:keep], data.dataset, {**data.info, "held_out": n_eval})
    target = load_target(cfg.model.target)
    return Sources(data, target, prompts, cfg.model.target.path and str(Path(cfg.model.target.path)),
                   mask)
