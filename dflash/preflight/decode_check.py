"""Preflight of the apps that decode with the target (`dflash.regenerate`,
`dflash.eval`): devices and TP, the target's files and dtype, and the weights (a TP
shard) with the KV cache of a batch against the GPU."""
from __future__ import annotations

from pathlib import Path

from dflash.errors import ConfigError, DataError
from dflash.options import choice
from dflash.preflight.command import Command
from dflash.preflight.common import (Placement, Session, devices_text, dtype_on_gpu,
                                     not_on_cpu, vocab_of, compose, placement, target_facts)
from dflash.preflight.report import Report
from dflash.preflight.target_files import read_tokenizer
from dflash.preflight.world import World


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
    params = layers * (mlp + attn) + 2 * vocab_of(hc) * h
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
    not_on_cpu(place, world, cfg.model.target.path, "dflash.regenerate")
    rep.add("devices", devices_text(place, cmd, world))
    hc, *_ = target_facts(cfg.model.target, place.tp, rep)
    dtype_on_gpu(cfg.model.target, place, "regenerate")
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
    not_on_cpu(place, world, cfg.model.target.path, "dflash.eval")
    hc, *_ = target_facts(cfg.model.target, place.tp, rep)
    dtype_on_gpu(cfg.model.target, place, "eval")
    if cfg.drafter and not Path(cfg.drafter).exists():
        rep.unchecked.append(f"drafter: {cfg.drafter} is not here")
    tokens = int(cfg.batch_size) * (int(cfg.max_new_tokens) + 2048)
    _decode_fits(hc, cfg.model.target, tokens, place, world, rep,
                 "batch_size x (prompt + max_new_tokens)")


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
