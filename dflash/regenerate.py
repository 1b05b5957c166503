"""`python -m dflash.regenerate inputs=[chats.jsonl] out=regen.jsonl model.target.path=DIR`

On-policy data: the target writes the replies its drafter will learn. Reads chat JSONL
(the formats `dflash.data.prepare` reads), regenerates the last assistant turn
(`turns=last`) or every assistant turn in order (`turns=each`) with the local target
(batched by length, KV-cached, greedy by default; `drafter=DIR` accelerates greedy
decoding losslessly) or an OpenAI-compatible server (`backend=openai
openai.base_url=...`), and writes chat JSONL that `prepare` reads unchanged, with
`finish_reason` and `generated_tokens` per line, plus OUT.report.json. Rerunning the same
command after a kill continues from OUT.parts/. Under torchrun every rank takes a share
of the batches and rank 0 writes the merged output.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from dflash import config
from dflash.data.loss_mask import end_of_turn_ids
from dflash.data.prepare import load_tokenizer
from dflash.errors import (ConfigError, check_file_path, hydra_dirs_checked, require,
                           user_errors_exit)
from dflash.generation.runner import Regeneration
from dflash.step import resolve_target_dtype
from dflash.model.compile import checked_backend
from dflash.options import choice
from dflash.step import emulated_bf16_warning
from dflash.topology import build_topology, export_submitit_env

config.register()

log = logging.getLogger("dflash.regenerate")


def build_backend(cfg, tok, topo):
    if choice(cfg.backend) == "openai":
        from dflash.decode.server import OpenAIBackend
        backend = OpenAIBackend.from_config(cfg, tok)
        backend.check_server()  # before any prompt is read or sent
        return backend
    from dflash.decode.local import LocalBackend
    from dflash.model.target import Target
    mode = choice(cfg.model.compile)
    if mode != "off" and cfg.drafter:  # refused before any model is loaded
        raise ConfigError("drafter= decodes speculatively (eager); model.compile compiles plain "
                          "decoding: set one of them")
    drafter = None
    if topo.tp_size > 1:  # a target too big for one device: sharded over its TP group
        from dflash.model.tp_target import TensorParallelTarget
        if cfg.drafter:
            raise ConfigError("drafter= with topology.target_tp > 1 is not supported: "
                              "regenerate with the sharded target alone")
        target = TensorParallelTarget.load(cfg.model.target, topo.tp_mesh)
    else:
        target = Target.from_config(cfg.model.target)
    if cfg.drafter:
        if float(cfg.temperature) > 0:
            raise ConfigError("drafter= accelerates greedy decoding only (temperature=0)")
        from dflash.model.checkpoint import load_drafter
        drafter = load_drafter(cfg.drafter, topo.target_device).eval()
        target = Target(target.lm, list(drafter.spec.target_layer_ids))
    target = target.to(topo.target_device).eval()
    warning = emulated_bf16_warning(
        ["model.target.dtype"] if str(cfg.model.target.dtype) == "bfloat16" else [],
        topo.target_device)
    if warning:
        log.warning(warning)
    if len(tok) > target.vocab_size:
        raise ConfigError(f"tokenizer has {len(tok)} tokens, more than the target's "
                          f"vocabulary of {target.vocab_size}")
    stop = set(end_of_turn_ids(tok))
    if tok.eos_token_id is not None:
        stop.add(int(tok.eos_token_id))
    return LocalBackend.from_config(
        cfg, target, stop, drafter, tok, pad_id=tok.pad_token_id or 0,
        compile_backend=None if mode == "off" else checked_backend(str(cfg.model.compile_backend)),
        decoding=auto_decoding(cfg, topo.tp_size))


def auto_decoding(cfg, tp_size: int) -> str | None:
    """"plain" where `decoding=auto` must not be left to timing, else None (the config's
    choice). The ranks of a TP group must run the same shapes, and auto's switch could
    differ between them. In half precision a verify step over a block rounds otherwise
    than one-token steps, so speculative and plain decoding part at near ties (in
    float32 they write the same tokens): a choice made by measured speed would make the
    replies depend on the machine's load."""
    if choice(cfg.decoding) != "auto":
        return None
    if tp_size > 1:
        return "plain"
    if str(cfg.model.target.dtype) != "float32":
        log.info("decoding=auto with model.target.dtype=%s: decoding plainly (in half "
                 "precision prompt lookup writes other tokens at near ties, and auto "
                 "chooses by timing); decoding=lookup forces it", cfg.model.target.dtype)
        return "plain"
    return None


def check_settings(cfg) -> None:
    """Sampling and output settings that cannot work, refused before the target loads."""
    require(float(cfg.temperature) >= 0, "temperature", cfg.temperature, "0 (greedy) or more")
    require(0 <= float(cfg.top_p) <= 1, "top_p", cfg.top_p, "in [0, 1]")
    require(int(cfg.max_new_tokens) >= 1, "max_new_tokens", cfg.max_new_tokens, ">= 1")
    require(int(cfg.max_seq_len) > int(cfg.max_new_tokens), "max_seq_len", cfg.max_seq_len,
            f"more than max_new_tokens={cfg.max_new_tokens} (it holds the prompt too)")
    require(0 <= float(cfg.confidence_stop) < 1, "confidence_stop", cfg.confidence_stop, "in [0, 1)")
    check_file_path("out", cfg.out)


def run_regenerate(cfg: DictConfig, out_dir) -> dict:
    # every rank started (torchrun, or a submitit/SLURM task) takes a share: the replica
    # count is the world
    check_settings(cfg)
    export_submitit_env()
    cfg.topology.dp_size = int(os.environ.get("WORLD_SIZE", 1))
    topo = build_topology(cfg.topology)
    resolve_target_dtype(cfg.model.target, topo.target_device)
    tp = topo.tp_size
    tok_dir = cfg.tokenizer or cfg.model.target.path
    if not tok_dir:
        raise ConfigError("regenerate needs a tokenizer: set tokenizer=DIR or model.target.path")
    tok = load_tokenizer(tok_dir)
    backend = build_backend(cfg, tok, topo)
    logger = None
    if cfg.logger.name == "wandb" and topo.is_main:
        from dflash.loggers import build_logger
        logger = build_logger(cfg.logger, Path(out_dir), OmegaConf.to_container(cfg, resolve=True))
    barrier = torch.distributed.barrier if topo.distributed else None
    with torch.no_grad():
        report = Regeneration(cfg, backend, tok, topo.rank // tp, topo.world_size // tp,
                              barrier, logger, writer=topo.is_main).run(Path(cfg.out))
    if logger is not None:
        logger.summary({k: v for k, v in report.items() if isinstance(v, (int, float))})
        logger.finish()
    return report


def format_report(r: dict) -> str:
    lines = [f"{r['conversations_written']} of {r['conversations_read']} conversations written "
             f"to {r['output']}; {r['lines_skipped']} skipped, {r['truncated']} replies hit "
             f"max_new_tokens ({r['truncated_policy']})",
             f"{r['generated_tokens']:,} tokens generated; this run "
             f"{r['generated_tokens_this_run']:,} in {r['seconds']:.1f} s "
             f"({r['tokens_per_second']:,.0f} tok/s, decoding {r['decoding']}), "
             f"{r['batches_resumed']} batches resumed, "
             f"{r['failed_requests_retried']} failed requests asked again"]
    lines += [f"  skipped {s['where']}: {s['reason']}" for s in r["skipped"][:10]]
    return "\n".join(lines)


@hydra_dirs_checked
@hydra.main(config_path="conf", config_name="regenerate", version_base="1.3")
@user_errors_exit
def main(cfg: DictConfig) -> None:
    report = run_regenerate(cfg, HydraConfig.get().runtime.output_dir)
    from dflash.topology import launch_rank
    if launch_rank() == 0:
        print(format_report(report))


if __name__ == "__main__":
    main()
