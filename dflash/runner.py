"""The training run: build every part from the config, then train.

    sources   data set + frozen target + held-out prompts   (dflash.sources)
    planner   one EpochPlan per epoch, this rank's shard     (dflash.batching)
    drafter   + AdamW + warmup/cosine schedule               (dflash.model, dflash.optim)
    step      target context -> drafter loss -> update       (dflash.step)
    logger    metrics.jsonl (+ W&B)                          (dflash.loggers)

The loop is `for epoch: for batch in shard(plan).batches(): step(batch)`; metrics stay
on the device and are gathered every `logger.log_every` steps. At the end the drafter
is written in the public DFlash layout and measured by real speculative decoding on
prompts training never saw, beside the untrained drafter's figure.
"""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from .batching.buckets import resolve_boundaries
from .batching.distributed import shard
from .batching.strategies import build_planner
from .config import choice
from .eval import evaluate
from .loggers import build_logger
from .model.checkpoint import save_drafter
from .model.drafter import DFlashDrafter, DrafterSpec
from .optim import build_optimizer
from .sources import build_sources
from .step import StepMetrics, TrainStep, collate, seeded_generator
from .topology import build_topology

log = logging.getLogger("dflash.runner")


class Runner:
    def __init__(self, cfg, out_dir: str | Path):
        self.cfg = cfg
        self.out_dir = Path(out_dir)

    # ---- build -----------------------------------------------------------------------
    def build(self) -> "Runner":
        cfg = self.cfg
        self.topo = build_topology(cfg.topology)
        torch.manual_seed(int(cfg.seed))
        self.sources = build_sources(cfg, progress=self.topo.is_main)
        self.target = self.sources.target.to(self.topo.target_device)
        self.dataset = self.sources.data.dataset
        lengths = self.sources.data.lengths
        self.boundaries = resolve_boundaries(cfg.buckets, lengths)
        self.planner = build_planner(cfg.batching, lengths, self.boundaries, int(cfg.seed))
        self.steps_per_epoch = self.shard(0).num_batches
        total = self.steps_per_epoch * int(cfg.epochs)
        if int(cfg.optim.max_steps) > 0:
            total = min(total, int(cfg.optim.max_steps)) if cfg.epochs > 0 else int(cfg.optim.max_steps)
        if total < 1:
            raise ValueError(f"nothing to train: epochs={cfg.epochs}, "
                             f"{self.steps_per_epoch} steps per epoch")
        self.total_steps = total
        self.drafter = self.build_drafter()
        module = self.drafter
        if self.topo.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP
            dev = self.topo.drafter_device
            module = DDP(self.drafter, device_ids=[dev] if dev.type == "cuda" else None)
        self.optimizer, self.scheduler = build_optimizer(self.drafter.parameters(), cfg.optim, total)
        dc = cfg.model.drafter
        self.step = TrainStep(
            self.target, self.drafter, self.optimizer, self.scheduler,
            num_anchors=dc.num_anchors, gamma=dc.gamma, grad_clip=cfg.optim.grad_clip,
            loss_chunk=cfg.model.loss_chunk, loss_impl=choice(cfg.model.loss_impl),
            autocast=choice(cfg.model.autocast),
            generator=seeded_generator(self.topo.drafter_device, int(cfg.seed), self.topo.rank),
            module=module)
        return self

    def build_drafter(self) -> DFlashDrafter:
        spec = DrafterSpec.from_target(self.target, self.cfg.model.drafter)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.cfg.model.drafter.seed))
            drafter = DFlashDrafter(spec)  # fp32 master weights, whatever the target's dtype
        drafter.set_attention(choice(self.cfg.model.attention))
        return drafter.to(self.topo.drafter_device)

    def shard(self, epoch: int):
        b = self.cfg.batching
        return shard(self.planner.epoch(epoch), self.topo.rank, self.topo.world_size,
                     choice(b.remainder), bool(b.balance_steps), float(b.attention_cost),
                     int(self.cfg.seed))

    # ---- run -------------------------------------------------------------------------
    def evaluate(self) -> dict:
        e = self.cfg.eval
        if not e.enabled or not self.sources.eval_prompts:
            return {}
        r = evaluate(self.target, self.drafter, self.sources.eval_prompts, int(e.max_new_tokens),
                     temperature=float(e.temperature), batch_size=int(e.batch_size),
                     seed=int(e.seed), eos_token_id=getattr(self.target.config, "eos_token_id", None))
        return r.as_dict()

    def run(self) -> dict:
        cfg, topo = self.cfg, self.topo
        t_start = time.time()
        resolved = OmegaConf.to_container(cfg, resolve=True)
        logger = build_logger(cfg.logger, self.out_dir, resolved, topo.rank)
        failed = True
        try:
            before = self.evaluate() if topo.is_main else {}
            summary = self.train(logger)
            after = self.evaluate() if topo.is_main else {}
            summary.update({
                "initial_acceptance_length": before.get("acceptance_length"),
                "acceptance_length": after.get("acceptance_length"),
                "eval": {"before": before, "after": after,
                         "num_prompts": len(self.sources.eval_prompts),
                         "max_new_tokens": int(cfg.eval.max_new_tokens),
                         "temperature": float(cfg.eval.temperature)},
                "wall_seconds": time.time() - t_start})
            if topo.is_main:
                self.write_outputs(summary, resolved)
                logger.summary(summary)
            failed = False
            return summary
        finally:
            logger.finish(failed)

    def train(self, logger) -> dict:
        from tqdm.auto import tqdm

        cfg = self.cfg
        every = max(1, int(cfg.logger.log_every))
        metrics, total = StepMetrics(), StepMetrics()
        bar = tqdm(total=self.total_steps, desc=f"train {self.planner.strategy}", unit="step",
                   disable=not (cfg.logger.progress and self.topo.is_main), mininterval=1.0)
        step, first_loss, last = 0, None, {}
        compiles_before = _compile_count()
        t0 = time.perf_counter()
        done = False
        for epoch in range(max(1, int(cfg.epochs))):
            for batch in self.shard(epoch).batches():
                b = collate(self.dataset, batch, self.topo.target_device)
                m = self.step.drafter_step(b, self.step.context(b).to(
                    self.topo.drafter_device, non_blocking=True))
                metrics.add(m, batch)
                total.add(m, batch)
                step += 1
                if step == 1 or step % every == 0 or step == self.total_steps:
                    rec = metrics.flush()  # the one host sync per interval
                    first_loss = rec["loss"] if first_loss is None else first_loss
                    elapsed = time.perf_counter() - t0
                    rec.update(epoch=epoch, tokens_per_second=total.tokens / elapsed,
                               padded_tokens_per_second=total.padded / elapsed,
                               elapsed=elapsed)
                    if self.topo.is_main:
                        logger.log(rec, step)
                    bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_second']:.0f}",
                                    eff=f"{rec['padding_efficiency']:.2f}")
                    last = rec
                bar.update(1)
                if step >= self.total_steps:
                    done = True
                    break
            if done:
                break
        bar.close()
        seconds = time.perf_counter() - t0
        return {"steps": step, "samples_seen": total.samples,
                "tokens_per_second": total.tokens / seconds,
                "padded_tokens_per_second": total.padded / seconds,
                "padding_efficiency": total.tokens / max(1, total.padded),
                "real_tokens": total.tokens, "padded_tokens": total.padded,
                "initial_loss": first_loss, "final_loss": last.get("loss"),
                "final_accept_est": last.get("accept_est"),
                "warmup_shapes": [], "compiles_after_warmup": _compile_count() - compiles_before,
                "strategy": self.planner.strategy, "buckets": self.boundaries.tolist(),
                "train_seconds": seconds, "epochs": int(cfg.epochs),
                "world_size": self.topo.world_size, "data": self.sources.data.info,
                "target_dir": self.sources.target_dir}

    def write_outputs(self, summary: dict, resolved: dict) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        save_drafter(self.drafter, self.out_dir / "drafter")
        (self.out_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(resolved))
        with open(self.out_dir / "eval_prompts.jsonl", "w") as f:
            for p in self.sources.eval_prompts:
                f.write(json.dumps({"prompt_ids": [int(t) for t in p]}) + "\n")
        (self.out_dir / "summary.json").write_text(json.dumps(_finite(summary), indent=2))


def _compile_count() -> int:
    """Graphs dynamo has compiled so far in this process (0 when nothing is compiled)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"].get("unique_graphs", 0))


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
