"""The training run: build every part from the config, then train.

    sources   data set + frozen target + held-out prompts   (dflash.sources)
    length    the plans, this rank's shard, the run's steps (dflash.batching)
    shapes    the closed shape set every batch runs at       (dflash.warmup.shapes)
    drafter   + objective + AdamW + warmup/cosine schedule   (dflash.model.build, dflash.optim)
    step      target context -> drafter loss -> update       (dflash.step)
    logger    metrics.jsonl (+ W&B)                          (dflash.loggers)

Each part builds itself from its config section; `Trainer` only composes them. Before
step 1 every planned shape is warmed (dflash.warmup) and a compile monitor then watches
for anything compiled or tuned mid-training. `train()` is the algorithm: for each epoch,
for each batch of this rank's shard, the pipeline brings the target's context and the
drafter takes one step; the bookkeeping around it (metrics, NaN guard, evaluation and
checkpoint cadence) lives in small helpers. At the end the drafter is written in the
public DFlash layout and measured by real speculative decoding on prompts training never
saw, beside the untrained drafter's figure.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from dflash import run_summary
from dflash.batching.packed_rows import anchor_slots
from dflash.batching.report import plan_info, plan_quality
from dflash.batching.run_length import RunLength
from dflash.batching.strategies import planner_for
from dflash.eval.config import check_eval_config
from dflash.eval.held_out import held_out_report
from dflash.eval.teacher_forced import acceptance_gap
from dflash.errors import check_dir_path
from dflash.loggers import build_logger, check_logger, check_wandb_login
from dflash.metrics import Meter, NonFiniteGuard
from dflash.model.build import (build_draft_vocab, build_drafter, build_objective, check_init,
                                 model_record)
from dflash.model.checkpoint import export_dtype
from dflash.model.compile import compile_drafter
from dflash.model.feature_cache import FeatureCache
from dflash.model.config import check_drafter_config, check_loss_config
from dflash.optim import build_optimizer, check_optim
from dflash.options import choice
from dflash.pipeline import Pipeline
from dflash.preemption import SignalStop, requeue_job
from dflash.resume import Progress
from dflash.run.dir import run_names, write_run_dir, write_summary
from dflash.run.identity import checkpointer
from dflash.sources import sources_for_ranks
from dflash.step import StepPolicy, TrainStep, resolve_target_dtype, seeded_generator
from dflash.topology import build_topology, replica_digests
from dflash.warmup.monitor import CompileMonitor, loaded_autotuners
from dflash.warmup.profile import step_pricer
from dflash.warmup.run import configure_compile, use_compile_caches, warm_run
from dflash.warmup.shapes import build_shape_plan

log = logging.getLogger("dflash.trainer")


def check_settings(cfg) -> None:
    """Every section's values that cannot work, and the warm start's files, refused before
    the target loads (minutes on a large one); preflight runs the same."""
    check_optim(cfg.optim)
    check_drafter_config(cfg.model.drafter)
    check_loss_config(cfg.loss)
    check_eval_config(cfg.eval)
    check_logger(cfg.logger)
    check_init(cfg.model.drafter)
    check_dir_path("data.cache_dir", cfg.data.cache_dir)


class Trainer:
    def __init__(self, cfg, out_dir: str | Path):
        self.cfg = cfg
        self.out_dir = Path(out_dir)

    # ---- build -----------------------------------------------------------------------
    def build(self) -> "Trainer":
        cfg = self.cfg
        check_settings(cfg)
        self.topo = topo = build_topology(cfg.topology)
        resolve_target_dtype(cfg.model.target, topo.target_device)
        # `cost=FILE` is read now: a file of another device or model is refused before
        # the target loads, not after the first evaluation and warmup
        self.pricer = step_pricer(cfg, topo.drafter_device)
        if topo.is_main:
            check_wandb_login(cfg.logger)
        use_compile_caches(cfg.data.cache_dir)  # before anything compiles or tunes
        torch.manual_seed(int(cfg.seed))
        self.sources = sources_for_ranks(cfg, topo)
        self.target = self.sources.target.to(topo.target_device)
        self.dataset, lengths = self.sources.data.dataset, self.sources.data.lengths
        self.boundaries, self.planner = planner_for(cfg, lengths)
        self.length = RunLength.build(cfg, self.planner, topo.rank, topo.world_size)
        self.num_anchors = anchor_slots(self.planner, int(cfg.model.drafter.num_anchors),
                                        int(cfg.batching.anchors_per_row))
        longest = int(lengths.max()) if len(lengths) else 0
        if not self.planner.packs_rows and self.num_anchors > 2 * max(longest, 1):
            # every slot past a row's tokens is padding the drafter still computes: a
            # typo here (100000 for 1000) is an out-of-memory later, say so first
            log.warning("model.drafter.num_anchors=%d: the longest sample has %d tokens; the "
                        "slots past a row's tokens are padding the drafter computes (memory "
                        "and time): lower it", self.num_anchors, longest)
        # every epoch's whole plan (all ranks' batches): each rank warms the same shapes
        self.shapes = build_shape_plan(
            [self.planner.epoch(e) for e in range(self.length.num_epochs)], cfg.warmup,
            self.num_anchors, self.compiles())
        self.drafter = build_drafter(cfg, self.target, self.sources.mask_token_id,
                                     topo.drafter_device)
        configure_compile(choice(cfg.model.compile), self.shapes.num_run_shapes())
        local = module = compile_drafter(self.drafter, cfg.model, topo.drafter_device)
        if topo.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP
            dev = topo.drafter_device
            module = DDP(local, device_ids=[dev] if dev.type == "cuda" else None)
        optimizer, scheduler = build_optimizer(
            self.drafter.parameters(), cfg.optim, self.length.total_steps,
            self.drafter.norm.weight, float(cfg.model.drafter.norm_lr_scale))
        vocab = build_draft_vocab(int(cfg.loss.draft_vocab), int(self.target.vocab_size),
                                  self.dataset, len(lengths), topo.drafter_device)
        objective = build_objective(cfg, self.drafter, self.num_anchors, vocab,
                                    self.dataset.anchor_candidates(), self.planner.epoch(0))
        self.train_step = TrainStep(
            self.target, self.drafter, optimizer, scheduler, objective,
            StepPolicy.build(cfg, topo.drafter_device),
            generator=seeded_generator(topo.drafter_device, int(cfg.seed), topo.rank),
            module=module, local=local,
            feature_cache=FeatureCache.build(cfg.model.target, lengths, topo.tp_size))
        return self

    def compiles(self) -> bool:
        """Whether anything in this run compiles or autotunes per shape: model.compile,
        or CUDA (flex attention is compiled there, the Triton CE autotunes)."""
        cfg, topo = self.cfg, self.topo
        return (choice(cfg.model.compile) != "off" or choice(cfg.model.loss_impl) == "triton"
                or "cuda" in (topo.target_device.type, topo.drafter_device.type))

    @property
    def evaluates(self) -> bool:
        """Rank 0 measures acceptance; under target_tp every rank decodes in step with
        its group (a sharded target runs only with all of its ranks)."""
        return self.topo.is_main or self.topo.tp_size > 1

    @property
    def num_epochs(self) -> int:
        return self.length.num_epochs

    @property
    def total_steps(self) -> int:
        return self.length.total_steps

    def shard(self, epoch: int):
        return self.length.shard(epoch)

    # ---- run -------------------------------------------------------------------------
    def evaluate(self, teacher_forced: bool = False, label: str | None = None) -> dict:
        """Decoded acceptance on the held-out prompts (dflash.eval.held_out)."""
        shown = label if self.cfg.logger.progress and self.topo.is_main else None
        return held_out_report(self.target, self.drafter, self.sources.eval_prompts,
                               self.cfg.eval, teacher_forced, shown)

    def run(self) -> dict:
        cfg, topo = self.cfg, self.topo
        t_start = time.time()
        resolved = OmegaConf.to_container(cfg, resolve=True)
        names = run_names(cfg.logger)
        # the checkpoint to resume from, refused now if it is another run's (not after the
        # evaluation, nor with a W&B run opened for it); a resumed run takes the
        # evaluation before training it saved
        ck = checkpointer(cfg, self.out_dir, topo, self.train_step)
        found = ck.checked()
        logger = build_logger(cfg.logger, self.out_dir, resolved, topo.rank,
                              run_name=names["run_name"], group=names["group"],
                              resuming=str(cfg.resume) != "never")
        failed = True
        try:
            before = found[2].get("before") if found else None
            if before is None:
                before = self.evaluate(label="eval before training") if self.evaluates else {}
            if topo.is_main:
                logger.log_plan(plan_info(self.planner, self.boundaries, self.length,
                                          self.shapes.report()))
                if not found:  # a resumed run logged it at step 0 already
                    logger.log_eval(before, 0)
            summary = self.train(logger, ck, ck.restore(found), before)
            if summary["preempted"]:  # checkpoint written: stop cleanly, resume=auto goes on
                summary["requeued"] = (requeue_job(str(cfg.checkpoint.requeue), summary["preempted"])
                                       if topo.is_main else None)
            else:
                summary = self.finish(summary, before, logger, names)
            summary["wall_seconds"] = time.time() - t_start
            if topo.is_main:
                self.write(summary, resolved, logger)
            failed = False
            return summary
        finally:
            logger.finish(failed)

    def finish(self, summary: dict, before: dict, logger, names: dict) -> dict:
        """After the last step: the held-out evaluation, the gap to the training estimate."""
        after = (self.evaluate(teacher_forced=True, label="eval after training")
                 if self.evaluates else {})
        gap = acceptance_gap(summary["final_accept_est"], after.get("teacher_forced", {}),
                             after, float(self.cfg.eval.temperature)) if after else None
        if gap and gap["warning"]:
            log.warning(gap["warning"])
        run_summary.with_eval(summary, before, after, gap, len(self.sources.eval_prompts),
                              self.cfg.eval)
        summary.update(plan_quality(self.planner), run_name=names["run_name"],
                       group=names["group"], overrides=names["overrides"])
        if self.topo.is_main:
            logger.log_eval(after, summary["steps"])
        return summary

    def write(self, summary: dict, resolved: dict, logger) -> None:
        """The run dir: a preempted run its summary (the checkpoint holds the rest), a
        finished one the drafter (public DFlash layout, + its draft head) and config."""
        if summary["preempted"]:
            write_summary(self.out_dir, summary)
            return
        vocab = self.train_step.objective.vocab
        dtype = export_dtype(choice(self.cfg.checkpoint.dtype), self.topo.drafter_device)
        write_run_dir(self.out_dir, self.drafter, resolved, self.sources.eval_prompts, summary,
                      dtype, draft_head=None if vocab is None else
                      (vocab.ids, self.target.lm_head_weight))
        logger.summary(summary)

    def train(self, logger, ck=None, saved: dict | None = None, before: dict | None = None) -> dict:
        """The loop from `saved`, the state `ck` restored (run() found and checked it before
        its evaluation; without `ck`, found here); `before`, the evaluation before
        training, goes into every checkpoint for the summary of a resumed run."""
        if ck is None:
            ck = checkpointer(self.cfg, self.out_dir, self.topo, self.train_step)
            saved = ck.load()
        progress = Progress.restore(saved)
        warmed = warm_run(self.train_step, self.shapes.warm, self.topo,
                          bool(self.cfg.logger.progress), self.planner.packs_rows)
        monitor = CompileMonitor(choice(self.cfg.warmup.on_compile), loaded_autotuners)
        monitor.start()
        pipe = self.pipeline()
        meter = Meter(self.cfg.logger.log_every, self.total_steps, self.topo.drafter_device,
                      saved["totals"] if saved else (0, 0, 0),
                      predict=self.pricer)
        guard, stop, preempted = NonFiniteGuard(self.cfg.optim.max_skips), SignalStop(self.topo), None
        bar = self.progress_bar(progress.step)
        for epoch in range(progress.start[0], self.num_epochs):
            if progress.step >= self.total_steps or preempted:
                break
            items = pipe.run(self.shard(epoch).batches(progress.first_batch(epoch)))
            for item in items:
                tick = meter.clock.start()  # the step: loss, backward, update
                m = self.train_step.drafter_step(item.device_batch, item.context)
                item.times["drafter"] = meter.clock.stop(tick)
                meter.add(guard.add(progress.step + 1, item.batch, m), item)
                progress.batches_seen.append((item.batch.epoch, item.batch.index))
                progress.step += 1
                monitor.check(progress.step, item.shape)
                if meter.due(progress.step):
                    self.sync_metrics(meter, guard, progress, logger, bar, epoch)
                self.eval_if_due(progress, meter, logger)
                bar.update(1)
                preempted = stop.requested(progress.step, meter.every)
                ck.after_step(progress.step, preempted, lambda b=item.batch: (
                    self.length.next_position(b),
                    {**progress.snapshot(meter.totals), "before": before}), meter.every)
                if preempted or progress.step >= self.total_steps:
                    items.close()  # stops the pipeline's threads
                    break
        stop.restore()
        bar.close()
        self.batches_seen, self.eval_curve = progress.batches_seen, progress.eval_curve
        summary = run_summary.from_training(progress, meter, guard.skipped, preempted)
        summary.update(self.facts(), **monitor.report(), pipeline_depth=pipe.depth,
                       warmup={**self.shapes.report(), **warmed})
        return run_summary.check_summary(summary)

    # ---- bookkeeping around the loop -------------------------------------------------
    def facts(self) -> dict:
        """What this run is, for its summary: plan, model, data, replicas."""
        ob, cfg = self.train_step.objective, self.cfg
        return {"warmup_shapes": [w.as_list() for w in self.shapes.warm],
                "strategy": self.planner.strategy, "buckets": self.boundaries.tolist(),
                "seed": int(cfg.seed), "loss_norm": ob.norm, "loss_batch_weight": ob.batch_weight,
                "epochs": int(cfg.epochs), "world_size": self.topo.world_size,
                "replica_digests": replica_digests(self.drafter.state_dict(), self.topo),
                "batches_per_epoch": self.planner.epoch(0).num_batches,
                "steps_per_epoch": self.length.steps_per_epoch, "data": self.sources.data.info,
                "target_dir": self.sources.target_dir,
                "model": model_record(self.drafter, self.target, ob,
                                      self.train_step.feature_cache, self.num_anchors)}

    def pipeline(self) -> Pipeline:
        return Pipeline(self.train_step, self.dataset, self.shapes, self.topo.target_device,
                        self.topo.drafter_device, self.cfg.pipeline.depth,
                        int(self.cfg.pipeline.prefetch))

    def progress_bar(self, done: int):
        from tqdm.auto import tqdm
        bar = tqdm(total=self.total_steps, desc=f"train {self.planner.strategy}", unit="step",
                   disable=not (self.cfg.logger.progress and self.topo.is_main), mininterval=1.0)
        bar.update(done)
        return bar

    def sync_metrics(self, meter, guard, progress, logger, bar, epoch: int) -> None:
        """The one host sync per `logger.log_every` steps: check, log, show."""
        rec = meter.flush(epoch)
        guard.check(rec)
        progress.first_loss = rec["loss"] if progress.first_loss is None else progress.first_loss
        if self.topo.is_main:
            logger.log(rec, progress.step)
        bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_second']:.0f}",
                        eff=f"{rec['padding_efficiency']:.2f}",
                        tgt=f"{rec['time_target_ms']:.0f}ms",
                        dft=f"{rec['time_drafter_ms']:.0f}ms", slow=rec["bottleneck"])

    def eval_if_due(self, progress, meter, logger) -> None:
        """`eval.every_steps`: acceptance during training, its time not counted as training."""
        every = int(self.cfg.eval.every_steps) if self.cfg.eval.enabled else 0
        step = progress.step
        if not every or step % every or step >= self.total_steps:
            return
        te = time.perf_counter()
        point = self.evaluate() if self.evaluates else {}
        meter.exclude(time.perf_counter() - te)
        if point:
            progress.eval_curve.append({
                "step": step, "train_seconds": meter.elapsed(), "real_tokens": meter.tokens,
                "acceptance_length": point["acceptance_length"]})
            logger.log_eval(point, step)
