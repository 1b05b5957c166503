"""The training run's model parts from the config: the drafter (seeded, warm-started,
on its device), the draft vocabulary, the objective, and the record of what was trained.

Each builder reads the config keys of its part and nothing else of the run; the trainer
only composes them.
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from dflash.errors import DataError
from dflash.model.checkpoint import check_compatible, drafter_config, load_drafter
from dflash.model.draft_vocab import DraftVocab
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.dspark import check_heads_objective, num_drafts
from dflash.model.loss import Objective
from dflash.model.masks import check_flex_block_size
from dflash.options import choice

log = logging.getLogger("dflash.model")


def build_drafter(cfg, target, mask_token_id: int | None, device) -> DFlashDrafter:
    """The drafter of `cfg.model.drafter` for `target`: fp32 master weights whatever the
    target's dtype, seeded by model.drafter.seed, warm-started from model.drafter.init."""
    d = cfg.model.drafter
    spec = DrafterSpec.from_target(target, d, mask_token_id)
    if spec.markov_rank and int(cfg.loss.draft_vocab) > 0:  # W2 over the kept ids
        spec = dataclasses.replace(spec, draft_rows=min(int(cfg.loss.draft_vocab),
                                                        spec.vocab_size))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(d.seed))
        drafter = DFlashDrafter(spec)
    with torch.no_grad():  # (a warm start below replaces it)
        drafter.norm.weight.fill_(float(d.norm_init))
    if d.get("init"):
        warm_start(drafter, str(d.init))
    drafter.set_attention(choice(cfg.model.attention))
    if drafter.backend(device) == "flex":
        check_flex_block_size(spec.block_size)
    return drafter.to(device)


def check_init(drafter_cfg) -> None:
    """`model.drafter.init`'s files read before the target and data load (minutes on a
    large target): a wrong path or a cut file is refused first."""
    if drafter_cfg.get("init"):
        try:
            drafter_config(str(drafter_cfg.init))
        except DataError as exc:
            raise DataError(f"model.drafter.init: {exc}") from None


def warm_start(drafter: DFlashDrafter, path: str) -> None:
    """`model.drafter.init`: a published drafter's weights (public DFlash layout) into
    this run's drafter before step 1; the optimizer and schedule start fresh, and a
    resume (resume=) still wins over it."""
    where = f"model.drafter.init={path}"
    loaded = load_drafter(path)
    check_compatible(loaded.spec, drafter.spec, where)
    drafter.load_state_dict(loaded.state_dict())
    log.info("drafter initialised from %s", path)


def build_draft_vocab(size: int, vocab_size: int, dataset, num_samples: int, device):
    """`loss.draft_vocab` > 0: the training softmax's token ids, ranked by how often the
    training samples supervise them (the same on every rank); None for 0."""
    if int(size) == 0:
        return None
    counts = np.zeros(int(vocab_size), dtype=np.int64)
    data = dataset.supervised_counts(num_samples)
    counts[:len(data)] = data[:len(counts)]
    vocab = DraftVocab.most_frequent(counts, int(size)).to(device)
    log.info("loss.draft_vocab=%d: the training softmax over %d of %d token ids, %.2f%% "
             "of the supervised tokens", size, len(vocab), len(counts), 100 * vocab.coverage)
    return vocab


def build_objective(cfg, drafter: DFlashDrafter, num_anchors: int, vocab, anchors,
                    first_plan) -> Objective:
    """The loss of `cfg.loss` / `cfg.model` for `drafter`. loss.norm=plan divides every
    batch by one constant, the expected weight of a batch of `first_plan` (epoch 0) over
    the data's `anchors` candidates: the same on every rank."""
    m, loss = cfg.model, cfg.loss
    ob = Objective(num_anchors=num_anchors, gamma=float(loss.gamma),
                   anchors_per_document=int(m.drafter.num_anchors),
                   chunk=int(m.loss_chunk), chunk_mb=float(m.loss_chunk_mb),
                   impl=choice(m.loss_impl), kind=choice(loss.kind),
                   dpace_alpha=float(loss.dpace_alpha), kl_temperature=float(loss.kl_temperature),
                   dspark_weights=tuple(float(x) for x in loss.dspark_weights), vocab=vocab)
    check_heads_objective(drafter.spec, ob.kind)
    if drafter.markov_head is not None and vocab is not None:
        # W2's rows are the draft vocabulary's, in its id order
        drafter.markov_head.ids = vocab.ids.to(drafter.norm.weight.device)
    if choice(loss.norm) != "plan":
        return ob
    weight = ob.expected_batch_weight(anchors, first_plan, num_drafts(drafter.spec) + 1)
    return dataclasses.replace(ob, norm="plan", batch_weight=weight)


def model_record(drafter: DFlashDrafter, target, objective: Objective, cache,
                 anchor_slots: int) -> dict:
    """What was trained, read off the models themselves (a local target's sizes are its
    config.json's, whatever the model group's defaults say)."""
    spec, vocab = drafter.spec, objective.vocab
    return {"target_hidden_size": int(target.hidden_size), "target_layers": len(target.base.layers),
            "vocab_size": int(target.vocab_size), "target_layer_ids": list(spec.target_layer_ids),
            "drafter_layers": spec.num_layers,
            "layer_types": list(spec.layer_types) or ["full_attention"] * spec.num_layers,
            "sliding_window": spec.sliding_window, "causal": spec.causal,
            "block_size": spec.block_size, "mask_token_id": spec.mask_token_id,
            "markov_rank": spec.markov_rank, "confidence_head": spec.confidence_head,
            "sample_from_anchor": spec.sample_from_anchor,
            "anchor_slots": int(anchor_slots), "loss": objective.kind,
            "draft_vocab": None if vocab is None else {"size": len(vocab),
                                                       "coverage": vocab.coverage},
            "target_cache": None if cache is None else {
                "samples": len(cache.rows), "mb": round(cache.bytes / 2**20, 1),
                "hits": cache.hits, "misses": cache.misses}}
