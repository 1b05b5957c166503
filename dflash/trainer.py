"""The training run: build every part from the config, then train.

    sources   data set + frozen target + held-out prompts   (dflash.sources.build)
    planner   one EpochPlan per epoch, this rank's shard     (dflash.batching)
    shapes    the closed shape set every batch runs at       (dflash.warmup.shapes)
    drafter   + AdamW + warmup/cosine schedule               (dflash.model, dflash.optim)
    step      target context -> drafter loss -> update       (dflash.step)
    logger    metrics.jsonl (+ W&B)                          (dflash.loggers)

Before step 1 every planned shape is warmed (dflash.warmup.run) and a compile monitor then
watches for anything compiled or tuned mid-training (dflash.warmup.monitor).
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

import numpy as np
import torch
from omegaconf import OmegaConf

from dflash.batching.boundaries import resolve_boundaries
from dflash.batching.distributed import shard
from dflash.batching.strategies import build_planner
from dflash.warmup.monitor import CompileMonitor
from dflash.options import choice
from dflash.errors import DataError
from dflash.eval.decode import evaluate
from dflash.loggers import build_logger
from dflash.model.checkpoint import save_drafter
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.optim import build_optimizer
from dflash.warmup.shapes import build_shape_plan
from dflash.sources.build import build_sources
from dflash.batching.packed_rows import anchor_slots_per_row
from dflash.resume import Checkpointer, SignalStop, requeue_job
from dflash.pipeline import DrafterClock, Pipeline, StageTimes
from dflash.step import StepMetrics, TrainStep, seeded_generator
from dflash.topology import build_topology
from dflash.warmup.run import configure_compile, use_compile_caches, warm, warm_ranks

log = logging.getLogger("dflash.trainer")


class Trainer:
    def __init__(self, cfg, out_dir: str | Path):
        self.cfg = cfg
        self.out_dir = Path(out_dir)

    # ---- build -----------------------------------------------------------------------
    def build(self) -> "Trainer":
        cfg = self.cfg
        self.topo = build_topology(cfg.topology)
        use_compile_caches(cfg.data.cache_dir)  # before anything compiles or tunes
        torch.manual_seed(int(cfg.seed))
        # rank 0 builds (and caches) the data and fitted target first; the others then
        # read its cache instead of racing to write the same files
        if self.topo.distributed and not self.topo.is_main:
            torch.distributed.barrier()
        self.sources = build_sources(cfg, progress=self.topo.is_main)
        if self.topo.distributed and self.topo.is_main:
            torch.distributed.barrier()
        self.target = self.sources.target.to(self.topo.target_device)
        self.dataset = self.sources.data.dataset
        lengths = self.sources.data.lengths
        self.boundaries = resolve_boundaries(cfg.buckets, lengths, int(cfg.data.max_seq_len))
        self.planner = build_planner(cfg.batching, lengths, self.boundaries, int(cfg.seed),
                                     int(cfg.data.max_seq_len))
        self.steps_per_epoch = self.shard(0).num_batches
        total = self.steps_per_epoch * int(cfg.epochs)
        if int(cfg.optim.max_steps) > 0:
            total = min(total, int(cfg.optim.max_steps)) if cfg.epochs > 0 else int(cfg.optim.max_steps)
        if int(cfg.optim.max_tokens) > 0:
            total = min(total, self.steps_for_tokens(int(cfg.optim.max_tokens), total))
        if total < 1:
            raise DataError(f"nothing to train: epochs={cfg.epochs}, "
                             f"{self.steps_per_epoch} steps per epoch")
        self.total_steps = total
        self.num_epochs = -(-total // self.steps_per_epoch)
        # every epoch's whole plan (all ranks' batches): each rank warms the same shapes
        self.num_anchors = self.anchor_slots()
        self.shapes = build_shape_plan([self.planner.epoch(e) for e in range(self.num_epochs)],
                                       cfg.warmup, self.num_anchors)
        self.drafter = self.build_drafter()
        local = self.compiled(self.drafter)
        module = local
        if self.topo.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP
            dev = self.topo.drafter_device
            module = DDP(local, device_ids=[dev] if dev.type == "cuda" else None)
        self.optimizer, self.scheduler = build_optimizer(self.drafter.parameters(), cfg.optim, total)
        dc = cfg.model.drafter
        self.train_step = TrainStep(
            self.target, self.drafter, self.optimizer, self.scheduler,
            num_anchors=self.num_anchors, anchors_per_document=int(dc.num_anchors),
            gamma=dc.gamma, grad_clip=cfg.optim.grad_clip,
            loss_chunk=cfg.model.loss_chunk, loss_chunk_mb=cfg.model.loss_chunk_mb, loss_impl=choice(cfg.model.loss_impl),
            autocast=choice(cfg.model.autocast),
            generator=seeded_generator(self.topo.drafter_device, int(cfg.seed), self.topo.rank),
            module=module, local=local, log_grad_norm=bool(cfg.logger.grad_norm),
            nonfinite=choice(cfg.optim.nonfinite))
        return self

    def anchor_slots(self) -> int:
        """Anchor slots per row: the drafter's num_anchors, or for packed rows the slots
        their documents would get unpacked (row_packing.anchor_slots_per_row)."""
        n = int(self.cfg.model.drafter.num_anchors)
        if self.planner.strategy != "packed":
            return n
        return anchor_slots_per_row(self.sources.data.lengths, n, self.planner.spec.row_len,
                                    int(self.cfg.batching.anchors_per_row))

    def steps_for_tokens(self, budget: int, limit: int) -> int:
        """Steps until every rank together has trained on `budget` real tokens, from the
        full epoch plans (the same on every rank, so all ranks stop at the same step)."""
        world, steps, seen, epoch = self.topo.world_size, 0, 0, 0
        while steps < limit:
            plan = self.planner.epoch(epoch)
            cum = seen + np.cumsum(plan.num_tokens, dtype=np.int64)
            if cum[-1] >= budget:
                k = int(np.searchsorted(cum, budget)) + 1  # batches needed
                return min(limit, steps + -(-k // world))
            seen, steps, epoch = int(cum[-1]), steps + self.shard(epoch).num_batches, epoch + 1
        return limit

    def plan_quality(self) -> dict:
        """Diversity of the run's plans: pair repeat rate (epoch 0 -> 1) and length mixing."""
        from dflash.batching.metrics import length_mixing, pair_repeat_rate
        lengths = self.sources.data.lengths
        e0, e1 = self.planner.epoch(0), self.planner.epoch(1)
        return {"pair_repeat_rate": pair_repeat_rate(e0, e1, len(lengths)),
                "length_mixing": length_mixing(e0, lengths),
                "plan_padding_efficiency": e0.padding_efficiency}

    def plan_info(self) -> dict:
        """What the logger shows once: per-bucket table, lengths and boundaries, shapes."""
        from dflash.batching.metrics import bucket_table
        return {"buckets": bucket_table(self.planner.epoch(0), self.boundaries),
                "boundaries": self.boundaries.tolist(), "lengths": self.sources.data.lengths,
                **self.plan_quality(), "steps_per_epoch": self.steps_per_epoch,
                "total_steps": self.total_steps, "shapes": self.shapes.report()}

    def compiled(self, drafter):
        """`model.compile`: the training forward compiled (block mask included); the
        drafter itself stays eager for evaluation and owns the weights."""
        mode = choice(self.cfg.model.compile)
        configure_compile(mode, self.shapes.num_run_shapes())
        if mode == "off":
            return drafter
        attention = choice(self.cfg.model.attention)
        if self.topo.drafter_device.type != "cuda" and attention == "flex":
            raise DataError("model.compile with model.attention=flex needs CUDA: torch has no "
                            "compiled flex_attention backward on CPU (use model.attention=sdpa)")
        if attention == "chunked":
            raise DataError("model.compile with model.attention=chunked: its key windows are "
                            "data-dependent shapes, eager only (use model.attention=sdpa or auto)")
        return torch.compile(drafter, dynamic=mode == "dynamic")

    def build_drafter(self) -> DFlashDrafter:
        spec = DrafterSpec.from_target(self.target, self.cfg.model.drafter)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.cfg.model.drafter.seed))
            drafter = DFlashDrafter(spec)  # fp32 master weights, whatever the target's dtype
        drafter.set_attention(choice(self.cfg.model.attention))
        drafter = drafter.to(self.topo.drafter_device)
        return drafter

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
        names = run_names(cfg.logger)
        logger = build_logger(cfg.logger, self.out_dir, resolved, topo.rank,
                              run_name=names["run_name"], group=names["group"])
        failed = True
        try:
            before = self.evaluate() if topo.is_main else {}
            if topo.is_main:
                logger.log_plan(self.plan_info())
                logger.log_eval(before, 0)
            summary = self.train(logger)
            if summary["preempted"]:  # checkpoint written: stop cleanly, resume=auto goes on
                summary["wall_seconds"] = time.time() - t_start
                summary["requeued"] = (requeue_job(str(cfg.checkpoint.requeue))
                                       if topo.is_main else None)
                if topo.is_main:
                    self.out_dir.mkdir(parents=True, exist_ok=True)
                    (self.out_dir / "summary.json").write_text(json.dumps(_finite(summary), indent=2))
                failed = False
                return summary
            after = self.evaluate() if topo.is_main else {}
            summary.update({
                "initial_acceptance_length": before.get("acceptance_length"),
                "acceptance_length": after.get("acceptance_length"),
                "eval": {"before": before, "after": after,
                         "num_prompts": len(self.sources.eval_prompts),
                         "max_new_tokens": int(cfg.eval.max_new_tokens),
                         "temperature": float(cfg.eval.temperature)},
                **self.plan_quality(), "run_name": names["run_name"], "group": names["group"],
                "overrides": names["overrides"],
                "wall_seconds": time.time() - t_start})
            if topo.is_main:
                logger.log_eval(after, summary["steps"])
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
        warmed = self.warm()
        monitor = CompileMonitor(choice(cfg.warmup.on_compile), _autotuners)
        monitor.start()
        pipe = Pipeline(self.train_step, self.dataset, self.shapes, self.topo.target_device,
                        self.topo.drafter_device, cfg.pipeline.depth, int(cfg.pipeline.prefetch))
        self.pipeline_depth = pipe.depth
        times, clock = StageTimes(), DrafterClock(self.topo.drafter_device)
        self.batches_seen = []  # (epoch, step) in the order the drafter trained on them
        eval_every = int(cfg.eval.every_steps) if cfg.eval.enabled else 0
        self.eval_curve, eval_seconds = [], 0.0
        ck = Checkpointer(self, cfg.checkpoint.every_steps, cfg.checkpoint.keep, cfg.resume,
                          cfg.checkpoint.force_resume)
        start_epoch, start_pos, resumed = 0, 0, ck.load()
        if resumed:
            step, first_loss = resumed["step"], resumed["first_loss"]
            start_epoch, start_pos = resumed["epoch"], resumed["position"]
            self.batches_seen = [tuple(x) for x in resumed["batches_seen"]]
            self.eval_curve = resumed["eval_curve"]
            total.tokens, total.padded, total.samples = resumed["totals"]
            bar.update(step)
        snapshot = lambda: {"batches_seen": self.batches_seen, "first_loss": first_loss,  # noqa: E731
                            "eval_curve": self.eval_curve,
                            "totals": (total.tokens, total.padded, total.samples)}
        stop, preempted = SignalStop(self.topo), None
        recent, skipped = [], []  # steps since the last sync; steps skipped (nonfinite=skip)
        t0 = time.perf_counter()
        done = step >= self.total_steps
        for epoch in range(start_epoch, self.num_epochs if not done else 0):
            items = pipe.run(self.shard(epoch).batches(start_pos if epoch == start_epoch else 0))
            for item in items:
                batch, shape = item.batch, item.shape
                tick = clock.start()
                m = self.train_step.drafter_step(item.device_batch, item.context)
                item.times["drafter"] = clock.stop(tick)
                recent.append((step + 1, batch, m["loss"], m["grad_norm"]))
                if m["skipped"]:
                    skipped.append((step + 1, batch))
                    if len(skipped) > int(cfg.optim.max_skips):
                        raise DataError(f"{len(skipped)} steps had a NaN/inf loss or gradient, more "
                                        f"than optim.max_skips={cfg.optim.max_skips}: "
                                        + "; ".join(_where(s_, b_) for s_, b_ in skipped[-3:]))
                    m = {k: torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0)
                         if isinstance(v, torch.Tensor) else v for k, v in m.items()}
                times.add(item.times)
                metrics.add(m, batch, shape.tokens)
                total.add(m, batch, shape.tokens)
                self.batches_seen.append((batch.epoch, batch.step))
                step += 1
                monitor.check(step, shape)
                if step == 1 or step % every == 0 or step == self.total_steps:
                    rec = metrics.flush()  # the one host sync per interval
                    if not (math.isfinite(rec["loss"]) and math.isfinite(rec["grad_norm"])):
                        raise DataError(_first_nonfinite(recent))
                    recent = []
                    rec.update(times.flush(clock))
                    first_loss = rec["loss"] if first_loss is None else first_loss
                    elapsed = time.perf_counter() - t0
                    rec.update(epoch=epoch, tokens_per_second=total.tokens / elapsed,
                               padded_tokens_per_second=total.padded / elapsed,
                               elapsed=elapsed)
                    if self.topo.is_main:
                        logger.log(rec, step)
                    bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_second']:.0f}",
                                    eff=f"{rec['padding_efficiency']:.2f}",
                                    tgt=f"{rec['time_target_ms']:.0f}ms",
                                    dft=f"{rec['time_drafter_ms']:.0f}ms", slow=rec["bottleneck"])
                    last = rec
                if eval_every and step % eval_every == 0 and step < self.total_steps:
                    te = time.perf_counter()  # evaluation time is not training time
                    point = self.evaluate() if self.topo.is_main else {}
                    dt = time.perf_counter() - te
                    eval_seconds, t0 = eval_seconds + dt, t0 + dt
                    if point:
                        self.eval_curve.append({
                            "step": step, "train_seconds": time.perf_counter() - t0,
                            "real_tokens": total.tokens, "acceptance_length": point["acceptance_length"]})
                        logger.log_eval(point, step)
                bar.update(1)
                preempted = stop.requested(step, every)
                if ck.due(step) or preempted or step >= self.total_steps:
                    if ck.due(step) or preempted:
                        ck.save(step, self.next_position(batch), snapshot())
                if preempted or step >= self.total_steps:
                    done = True
                    items.close()  # stops the pipeline's threads
                    break
            if done:
                break
        stop.restore()
        bar.close()
        seconds = time.perf_counter() - t0
        digests = self.replica_digests()
        return {"steps": step, "samples_seen": total.samples, "preempted": preempted,
                "skipped_steps": [s_ for s_, _ in skipped],
                "resumed_from": resumed["path"] if resumed else None,
                "tokens_per_second": total.tokens / seconds,
                "padded_tokens_per_second": total.padded / seconds,
                "padding_efficiency": total.tokens / max(1, total.padded),
                "real_tokens": total.tokens, "padded_tokens": total.padded,
                "initial_loss": first_loss, "final_loss": last.get("loss"),
                "final_accept_est": last.get("accept_est"),
                "warmup_shapes": [w.as_list() for w in self.shapes.warm],
                **monitor.report(), "warmup": {**self.shapes.report(), **warmed},
                "strategy": self.planner.strategy, "buckets": self.boundaries.tolist(),
                "train_seconds": seconds, "epochs": int(cfg.epochs),
                "eval_curve": self.eval_curve, "eval_seconds_during_training": eval_seconds,
                "world_size": self.topo.world_size, "replica_digests": digests,
                "batches_per_epoch": self.planner.epoch(0).num_batches,
                "steps_per_epoch": self.steps_per_epoch, "pipeline_depth": self.pipeline_depth,
                "stage_ms": {k: v for k, v in last.items() if k.startswith("time_")},
                "data": self.sources.data.info,
                "target_dir": self.sources.target_dir}

    def next_position(self, batch) -> tuple[int, int]:
        """(epoch, batch index) of the batch after this one: where a resume starts."""
        if batch.step + 1 >= self.shard(batch.epoch).num_batches:
            return batch.epoch + 1, 0
        return batch.epoch, batch.step + 1

    def replica_digests(self) -> list[str]:
        """A digest of the drafter's weights from every rank: DDP replicas must be equal
        bit for bit after the last step, or the run stops here saying so."""
        import hashlib
        h = hashlib.sha256()
        for k, v in sorted(self.drafter.state_dict().items()):
            h.update(k.encode())
            h.update(v.detach().float().cpu().numpy().tobytes())
        mine = h.hexdigest()[:16]
        if not self.topo.distributed:
            return [mine]
        import torch.distributed as dist
        every = [None] * self.topo.world_size
        dist.all_gather_object(every, mine)
        if len(set(every)) > 1:
            raise RuntimeError(f"drafter replicas diverged across ranks: {every}")
        return every

    def warm(self) -> dict:
        """Every warm shape through the real step, rank 0 first (it fills the caches)."""
        if not self.shapes.warm:
            return {"seconds": 0.0, "per_shape": []}
        vocab = int(self.target.vocab_size)
        return warm_ranks(self.topo, lambda: warm(
            self.train_step, self.shapes.warm, vocab, self.topo.drafter_device,
            progress=bool(self.cfg.logger.progress and self.topo.is_main),
            packed=self.planner.strategy == "packed"))

    def write_outputs(self, summary: dict, resolved: dict) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        save_drafter(self.drafter, self.out_dir / "drafter")
        (self.out_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(resolved))
        with open(self.out_dir / "eval_prompts.jsonl", "w") as f:
            for p in self.sources.eval_prompts:
                f.write(json.dumps({"prompt_ids": [int(t) for t in p]}) + "\n")
        (self.out_dir / "summary.json").write_text(json.dumps(_finite(summary), indent=2))


def _where(step: int, batch) -> str:
    ids = [int(i) for i in batch.sample_ids[:8]]
    more = "..." if batch.batch_size > 8 else ""
    return f"step {step} (epoch {batch.epoch}, batch {batch.step}, samples {ids}{more})"


def _first_nonfinite(recent) -> str:
    """Which step since the last sync went non-finite first (read only now, at the sync)."""
    vals = torch.stack([torch.stack([lo.float(), g.float()]) for _, _, lo, g in recent]).tolist()
    for (step, batch, _, _), (lo, g) in zip(recent, vals):
        if not (math.isfinite(lo) and math.isfinite(g)):
            return (f"NaN/inf {'loss' if not math.isfinite(lo) else 'gradient norm'} at "
                    f"{_where(step, batch)}; optim.nonfinite=skip skips such steps "
                    f"(up to optim.max_skips)")
    return "NaN/inf in the metrics since the last sync"


def run_names(logger_cfg) -> dict:
    """W&B run name and group: the config's, else the Hydra job's overrides and, in a
    multirun, the sweep dir's name (so sequential jobs of one sweep share a group)."""
    name, group = logger_cfg.get("run_name"), logger_cfg.get("group")
    try:
        from hydra.core.hydra_config import HydraConfig
        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return {"run_name": name, "group": group, "overrides": []}
    overrides = hc.job.override_dirname or hc.job.name
    if str(hc.mode) == "RunMode.MULTIRUN":
        group = group or Path(hc.sweep.dir).name
        name = name or f"{hc.job.num}_{overrides}"
    return {"run_name": name or overrides, "group": group, "overrides": list(hc.overrides.task)}


def _autotuners() -> list:
    """Autotuned kernels already loaded (importing Triton just to count them is waste)."""
    import sys
    mod = sys.modules.get("dflash.kernels.ce_triton")
    return mod.autotuners() if mod is not None else []


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
