"""The training run: build every part from the config, then train.

    sources   data set + frozen target + held-out prompts   (dflash.sources)
    planner   one EpochPlan per epoch, this rank's shard     (dflash.batching)
    shapes    the closed shape set every batch runs at       (dflash.warmup.shapes)
    drafter   + AdamW + warmup/cosine schedule               (dflash.model, dflash.optim)
    step      target context -> drafter loss -> update       (dflash.step)
    logger    metrics.jsonl (+ W&B)                          (dflash.loggers)

Before step 1 every planned shape is warmed (dflash.warmup) and a compile monitor then
watches for anything compiled or tuned mid-training. `train()` is the algorithm: for
each epoch, for each batch of this rank's shard, the pipeline brings the target's
context and the drafter takes one step; the bookkeeping around it (metrics, NaN
guard, evaluation and checkpoint cadence) lives in small helpers. At the end the
drafter is written in the public DFlash layout and measured by real speculative
decoding on prompts training never saw, beside the untrained drafter's figure.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from dflash.batching.distributed import shard
from dflash.batching.metrics import bucket_table, length_mixing, pair_repeat_rate
from dflash.batching.packed_rows import anchor_slots_per_row
from dflash.batching.strategies import planner_for
from dflash.errors import ConfigError
from dflash.eval.decode import evaluate
from dflash.eval.calibration import confidence_calibration
from dflash.eval.teacher_forced import acceptance_gap, teacher_forced_acceptance
from dflash.loggers import build_logger
from dflash.metrics import Meter, NonFiniteGuard
from dflash.batching.step_cost import load_cost_file
from dflash.model.checkpoint import check_compatible, export_dtype, load_drafter
from dflash.model.compile import checked_backend
from dflash.model.draft_vocab import DraftVocab
from dflash.model.feature_cache import FeatureCache
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.dspark import check_heads_objective, num_drafts
from dflash.model.loss import Objective
from dflash.model.masks import check_flex_block_size
from dflash.optim import build_optimizer
from dflash.options import choice
from dflash.pipeline import Pipeline
from dflash.preemption import SignalStop, requeue_job
from dflash import resume_identity
from dflash.resume import Checkpointer, Progress, plan_hash
from dflash.run_summary import RunSummary, check_summary
from dflash.run_dir import run_names, write_run_dir, write_summary
from dflash.sources import build_sources
from dflash.step import (StepPolicy, TrainStep, emulated_bf16_warning, resolve_target_dtype,
                         seeded_generator)
from dflash.topology import build_topology, replica_digests
from dflash.warmup.monitor import CompileMonitor
from dflash.warmup.profile import run_identity
from dflash.warmup.run import configure_compile, use_compile_caches, warm, warm_ranks
from dflash.warmup.shapes import build_shape_plan

log = logging.getLogger("dflash.trainer")


class Trainer:
    def __init__(self, cfg, out_dir: str | Path):
        self.cfg = cfg
        self.out_dir = Path(out_dir)

    # ---- build -----------------------------------------------------------------------
    def build(self) -> "Trainer":
        cfg = self.cfg
        self.topo = build_topology(cfg.topology)
        resolve_target_dtype(cfg.model.target, self.topo.target_device)
        use_compile_caches(cfg.data.cache_dir)  # before anything compiles or tunes
        torch.manual_seed(int(cfg.seed))
        self.sources = self._build_sources()
        self.target = self.sources.target.to(self.topo.target_device)
        self.dataset = self.sources.data.dataset
        lengths = self.sources.data.lengths
        self.boundaries, self.planner = planner_for(cfg, lengths)
        self._epoch_steps: dict[int, int] = {}
        self.steps_per_epoch = self.epoch_steps(0)
        self.total_steps = self._total_steps()
        self.num_epochs = self._epochs_for(self.total_steps)
        # every epoch's whole plan (all ranks' batches): each rank warms the same shapes
        self.num_anchors = self.anchor_slots()
        self.shapes = build_shape_plan([self.planner.epoch(e) for e in range(self.num_epochs)],
                                       cfg.warmup, self.num_anchors, self.compiles())
        self.drafter = self.build_drafter()
        local = self.compiled(self.drafter)
        module = local
        if self.topo.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP
            dev = self.topo.drafter_device
            module = DDP(local, device_ids=[dev] if dev.type == "cuda" else None)
        self.optimizer, self.scheduler = build_optimizer(
            self.drafter.parameters(), cfg.optim, self.total_steps, self.drafter.norm.weight,
            float(cfg.model.drafter.norm_lr_scale))
        self.train_step = TrainStep(
            self.target, self.drafter, self.optimizer, self.scheduler, self.objective(),
            self.step_policy(),
            generator=seeded_generator(self.topo.drafter_device, int(cfg.seed), self.topo.rank),
            module=module, local=local, feature_cache=self.feature_cache())
        return self

    def feature_cache(self):
        mb = float(self.cfg.model.target.cache_mb)
        if mb == 0:
            return None
        if self.topo.tp_size > 1:
            raise ConfigError("model.target.cache_mb needs topology.target_tp=1: a sharded "
                              "target runs every rank of its group together")
        return FeatureCache(self.sources.data.lengths, mb)

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

    def _build_sources(self):
        """Rank 0 builds (and caches) the data and fitted target first; the others then
        read its cache instead of racing to write the same files."""
        dist, tp = self.topo.distributed, self.topo.tp_size > 1
        deferred = []
        if dist and not self.topo.is_main:
            torch.distributed.barrier()
        sources = build_sources(self.cfg, progress=self.topo.is_main,
                                load_target=deferred.append if tp else None)
        if dist and self.topo.is_main:
            torch.distributed.barrier()
        if tp:  # every rank of a group loads its shard together (the load talks)
            from dflash.model.tp_target import TensorParallelTarget
            sources.target = TensorParallelTarget.load(deferred[0], self.topo.tp_mesh)
        return sources

    def epoch_steps(self, epoch: int) -> int:
        """This rank's steps in `epoch`: the count varies by epoch (the greedy rule packs
        a new shuffle), so the run's length is summed over the epochs it covers."""
        if epoch not in self._epoch_steps:
            self._epoch_steps[epoch] = self.shard(epoch).num_batches
        return self._epoch_steps[epoch]

    def _total_steps(self) -> int:
        """Steps of the run: the epochs' steps, capped by optim.max_steps and
        optim.max_tokens (epochs <= 0 with max_steps: max_steps)."""
        cfg = self.cfg
        epochs, max_steps = int(cfg.epochs), int(cfg.optim.max_steps)
        limit = max_steps if max_steps > 0 else None
        if int(cfg.optim.max_tokens) > 0:
            by_tokens = self.steps_for_tokens(int(cfg.optim.max_tokens), limit or 1 << 62)
            limit = by_tokens if limit is None else min(limit, by_tokens)
        if epochs <= 0 and limit is not None:
            total = limit
        else:
            total = 0
            for e in range(max(0, epochs)):
                total += self.epoch_steps(e)
                if limit is not None and total >= limit:
                    break
            total = total if limit is None else min(total, limit)
        if total < 1:
            raise ConfigError(f"nothing to train: epochs={cfg.epochs}, "
                              f"{self.steps_per_epoch} steps per epoch")
        return total

    def _epochs_for(self, steps: int) -> int:
        """Epochs the first `steps` steps reach into."""
        done, epoch = 0, 0
        while done < steps:
            done, epoch = done + self.epoch_steps(epoch), epoch + 1
        return epoch

    def objective(self) -> Objective:
        m, loss = self.cfg.model, self.cfg.loss
        ob = Objective(num_anchors=self.num_anchors, gamma=float(loss.gamma),
                       anchors_per_document=int(m.drafter.num_anchors),
                       chunk=int(m.loss_chunk), chunk_mb=float(m.loss_chunk_mb),
                       impl=choice(m.loss_impl), kind=choice(loss.kind),
                       dpace_alpha=float(loss.dpace_alpha),
                       kl_temperature=float(loss.kl_temperature),
                       dspark_weights=tuple(float(x) for x in loss.dspark_weights),
                       vocab=self.draft_vocab())
        check_heads_objective(self.drafter.spec, ob.kind)
        if self.drafter.markov_head is not None and ob.vocab is not None:
            # W2's rows are the draft vocabulary's, in its id order
            self.drafter.markov_head.ids = ob.vocab.ids.to(self.topo.drafter_device)
        if choice(loss.norm) != "plan":
            return ob
        # the constant every batch's weighted sum is divided by: the same on every rank
        weight = ob.expected_batch_weight(self.dataset.anchor_candidates(),
                                          self.planner.epoch(0), num_drafts(self.drafter.spec) + 1)
        return dataclasses.replace(ob, norm="plan", batch_weight=weight)

    def draft_vocab(self):
        """`loss.draft_vocab` > 0: the training softmax's token ids, ranked by how often
        the training samples supervise them (the same on every rank)."""
        size = int(self.cfg.loss.draft_vocab)
        if size == 0:
            return None
        counts = np.zeros(int(self.target.vocab_size), dtype=np.int64)
        data = self.dataset.supervised_counts(len(self.sources.data.lengths))
        counts[:len(data)] = data[:len(counts)]
        vocab = DraftVocab.most_frequent(counts, size).to(self.topo.drafter_device)
        log.info("loss.draft_vocab=%d: the training softmax over %d of %d token ids, %.2f%% "
                 "of the supervised tokens", size, len(vocab), len(counts), 100 * vocab.coverage)
        return vocab

    def step_policy(self) -> StepPolicy:
        o, m = self.cfg.optim, self.cfg.model
        bf16 = [k for k, on in (("model.autocast", choice(m.autocast) in ("bf16", "bfloat16")),
                                ("model.target.dtype", m.target.dtype == "bfloat16")) if on]
        warning = emulated_bf16_warning(bf16, self.topo.drafter_device)
        if warning:
            log.warning(warning)
        return StepPolicy(grad_clip=float(o.grad_clip), autocast=choice(self.cfg.model.autocast),
                          log_grad_norm=bool(self.cfg.logger.grad_norm),
                          nonfinite=choice(o.nonfinite), micro_rows=int(o.micro_rows))

    def anchor_slots(self) -> int:
        """Anchor slots per row: the drafter's num_anchors, or for packed rows the slots
        their documents would get unpacked (packed_rows.anchor_slots_per_row)."""
        n = int(self.cfg.model.drafter.num_anchors)
        if not self.planner.packs_rows:
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
            seen, steps, epoch = int(cum[-1]), steps + self.epoch_steps(epoch), epoch + 1
        return limit

    def plan_quality(self) -> dict:
        """Diversity of the run's plans: pair repeat rate (epoch 0 -> 1) and length mixing."""
        lengths = self.sources.data.lengths
        e0, e1 = self.planner.epoch(0), self.planner.epoch(1)
        return {"pair_repeat_rate": pair_repeat_rate(e0, e1, len(lengths)),
                "length_mixing": length_mixing(e0, lengths),
                "plan_padding_efficiency": e0.padding_efficiency}

    def plan_info(self) -> dict:
        """What the logger shows once: per-bucket table, lengths and boundaries, shapes."""
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
            raise ConfigError("model.compile with model.attention=flex needs CUDA: torch has no "
                              "compiled flex_attention backward on CPU (use model.attention=sdpa)")
        if attention == "chunked":
            raise ConfigError("model.compile with model.attention=chunked: its key windows are "
                              "data-dependent shapes, eager only (use model.attention=sdpa or auto)")
        backend = checked_backend(str(self.cfg.model.compile_backend))
        return torch.compile(drafter, dynamic=mode == "dynamic", backend=backend)

    def build_drafter(self) -> DFlashDrafter:
        spec = DrafterSpec.from_target(self.target, self.cfg.model.drafter,
                                       self.sources.mask_token_id)
        if spec.markov_rank and int(self.cfg.loss.draft_vocab) > 0:  # W2 over the kept ids
            spec = dataclasses.replace(spec, draft_rows=min(int(self.cfg.loss.draft_vocab),
                                                            spec.vocab_size))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.cfg.model.drafter.seed))
            drafter = DFlashDrafter(spec)  # fp32 master weights, whatever the target's dtype
        with torch.no_grad():  # (a warm start below replaces it)
            drafter.norm.weight.fill_(float(self.cfg.model.drafter.norm_init))
        if self.cfg.model.drafter.get("init"):
            self.warm_start(drafter, str(self.cfg.model.drafter.init))
        drafter.set_attention(choice(self.cfg.model.attention))
        if drafter.backend(self.topo.drafter_device) == "flex":
            check_flex_block_size(spec.block_size)
        return drafter.to(self.topo.drafter_device)

    @staticmethod
    def warm_start(drafter: DFlashDrafter, path: str) -> None:
        """`model.drafter.init`: a published drafter's weights (public DFlash layout) into
        this run's drafter before step 1; the optimizer and schedule start fresh, and a
        resume (resume=) still wins over it."""
        where = f"model.drafter.init={path}"
        loaded = load_drafter(path)
        check_compatible(loaded.spec, drafter.spec, where)
        drafter.load_state_dict(loaded.state_dict())
        log.info("drafter initialised from %s", path)

    def shard(self, epoch: int):
        b = self.cfg.batching
        return shard(self.planner.epoch(epoch), self.topo.rank, self.topo.world_size,
                     choice(b.remainder), bool(b.balance_steps), float(b.attention_cost),
                     int(self.cfg.seed))

    def checkpointer(self) -> Checkpointer:
        ident, force = resume_identity.identity(self.cfg), bool(self.cfg.checkpoint.force_resume)
        if self.topo.is_main:  # who this run is, for a later resume=auto in its dir
            resume_identity.write(self.out_dir, self.cfg)
        return Checkpointer(self.out_dir, self.cfg.checkpoint, self.cfg.resume,
                            plan_hash(self.cfg), self.topo, drafter=self.drafter,
                            optimizer=self.optimizer, scheduler=self.scheduler,
                            generator=self.train_step.generator, identity=ident,
                            verify=lambda meta, path: resume_identity.check(
                                meta.get("identity"), ident, str(path), force))

    # ---- run -------------------------------------------------------------------------
    def evaluate(self, teacher_forced: bool = False, label: str | None = None) -> dict:
        """Decoded acceptance on the held-out prompts; with `teacher_forced`, also the
        training estimate on those prompts followed by the tokens decoding produced.
        `label`: a progress bar over the prompts (the evaluations before and after
        training, which take minutes on a real model)."""
        e = self.cfg.eval
        prompts = self.sources.eval_prompts
        if not e.enabled or not prompts:
            return {}
        r = evaluate(self.target, self.drafter, prompts, int(e.max_new_tokens),
                     temperature=float(e.temperature), batch_size=int(e.batch_size),
                     seed=int(e.seed), eos_token_id=getattr(self.target.config, "eos_token_id", None),
                     confidence_stop=float(e.confidence_stop),
                     progress=label if self.cfg.logger.progress and self.topo.is_main else None)
        out = r.as_dict()
        if teacher_forced:
            seqs = [list(map(int, p)) + t for p, t in zip(prompts, r.tokens)]
            out["teacher_forced"] = teacher_forced_acceptance(
                self.target, self.drafter, seqs, [len(p) for p in prompts],
                batch_size=int(e.batch_size))
            if self.drafter.confidence_head is not None:  # DSpark: is its confidence right?
                out["calibration"] = confidence_calibration(
                    self.target, self.drafter, seqs, [len(p) for p in prompts],
                    batch_size=int(e.batch_size))
        return out

    def run(self) -> RunSummary:
        cfg, topo = self.cfg, self.topo
        t_start = time.time()
        resolved = OmegaConf.to_container(cfg, resolve=True)
        names = run_names(cfg.logger)
        logger = build_logger(cfg.logger, self.out_dir, resolved, topo.rank,
                              run_name=names["run_name"], group=names["group"],
                              resuming=str(cfg.resume) != "never")
        failed = True
        try:
            before = self.evaluate(label="eval before training") if self.evaluates else {}
            if topo.is_main:
                logger.log_plan(self.plan_info())
                logger.log_eval(before, 0)
            summary = self.train(logger)
            if summary["preempted"]:  # checkpoint written: stop cleanly, resume=auto goes on
                summary["wall_seconds"] = time.time() - t_start
                summary["requeued"] = (requeue_job(str(cfg.checkpoint.requeue))
                                       if topo.is_main else None)
                if topo.is_main:
                    write_summary(self.out_dir, summary)
                failed = False
                return summary
            after = (self.evaluate(teacher_forced=True, label="eval after training")
                     if self.evaluates else {})
            gap = acceptance_gap(summary["final_accept_est"], after.get("teacher_forced", {}),
                                 after, float(cfg.eval.temperature)) if after else None
            if gap and gap["warning"]:
                log.warning(gap["warning"])
            summary.update({
                "initial_acceptance_length": before.get("acceptance_length"),
                "acceptance_length": after.get("acceptance_length"),
                "acceptance": gap,
                "eval": {"before": before, "after": after,
                         "num_prompts": len(self.sources.eval_prompts),
                         "max_new_tokens": int(cfg.eval.max_new_tokens),
                         "temperature": float(cfg.eval.temperature)},
                **self.plan_quality(), "run_name": names["run_name"], "group": names["group"],
                "overrides": names["overrides"],
                "wall_seconds": time.time() - t_start})
            if topo.is_main:
                logger.log_eval(after, summary["steps"])
                vocab = self.train_step.objective.vocab
                write_run_dir(self.out_dir, self.drafter, resolved, self.sources.eval_prompts,
                              summary, export_dtype(choice(cfg.checkpoint.dtype),
                                                    self.topo.drafter_device),
                              draft_head=None if vocab is None else
                              (vocab.ids, self.target.lm_head_weight))
                logger.summary(summary)
            failed = False
            return summary
        finally:
            logger.finish(failed)

    def train(self, logger) -> RunSummary:
        ck = self.checkpointer()
        progress = Progress.restore(saved := ck.load())
        warmed = self.warm()
        monitor = CompileMonitor(choice(self.cfg.warmup.on_compile), _autotuners)
        monitor.start()
        pipe = self.pipeline()
        meter = Meter(self.cfg.logger.log_every, self.total_steps, self.topo.drafter_device,
                      saved["totals"] if saved else (0, 0, 0), predict=self.step_cost())
        guard, stop, preempted = NonFiniteGuard(self.cfg.optim.max_skips), SignalStop(self.topo), None
        bar = self.progress_bar(progress.step)
        for epoch in range(progress.start[0], self.num_epochs):
            if progress.step >= self.total_steps or preempted:
                break
            items = pipe.run(self.shard(epoch).batches(progress.first_batch(epoch)))
            for item in items:
                m = meter.drafter_step(self.train_step, item)  # the step: loss, backward, update
                m = guard.add(progress.step + 1, item.batch, m)
                meter.add(m, item)
                progress.batches_seen.append((item.batch.epoch, item.batch.index))
                progress.step += 1
                monitor.check(progress.step, item.shape)
                if meter.due(progress.step):
                    self.sync_metrics(meter, guard, progress, logger, bar, epoch)
                self.eval_if_due(progress, meter, logger)
                bar.update(1)
                preempted = stop.requested(progress.step, meter.every)
                ck.after_step(progress.step, preempted, lambda b=item.batch: (
                    self.next_position(b), progress.snapshot(meter.totals)), meter.every)
                if preempted or progress.step >= self.total_steps:
                    items.close()  # stops the pipeline's threads
                    break
        stop.restore()
        bar.close()
        return self.train_summary(progress, meter, guard, monitor, warmed, preempted, pipe.depth)

    # ---- bookkeeping around the loop -------------------------------------------------
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
        dt = time.perf_counter() - te
        meter.exclude(dt)
        if point:
            progress.eval_curve.append({
                "step": step, "train_seconds": meter.elapsed(), "real_tokens": meter.tokens,
                "acceptance_length": point["acceptance_length"]})
            logger.log_eval(point, step)

    def step_cost(self):
        """`cost=FILE`: seconds per run shape from a step cost file measured on this
        hardware and model (refused otherwise, naming the differing field)."""
        if not self.cfg.get("cost"):
            return None
        model, _ = load_cost_file(self.cfg.cost, run_identity(self.cfg, self.topo.drafter_device))
        cache: dict = {}
        last = [None]

        def predict(shape) -> float:
            """This step's predicted seconds; a shape change from the last step costs
            the profiled switch time too."""
            if shape not in cache:
                dims = (shape.batch_size, shape.seq_len, shape.anchors)
                same = float(model.seconds(*dims)[0])
                cache[shape] = (same, same + float(model.switch_seconds(*dims)[0]))
                if model.outside(shape.batch_size, shape.seq_len, shape.anchors)[0]:
                    log.warning("shape %s is outside the profiled range of %s: its step time "
                                "is extrapolated", shape.as_list(), self.cfg.cost)
            seconds = cache[shape][0 if shape == last[0] else 1]
            last[0] = shape
            return seconds
        return predict

    def train_summary(self, progress, meter, guard, monitor, warmed, preempted,
                      depth) -> RunSummary:
        seconds = meter.elapsed()
        last = meter.last
        self.batches_seen, self.eval_curve = progress.batches_seen, progress.eval_curve
        predicted = {"predicted_train_seconds": meter.predicted_total} if meter.predict else {}
        return check_summary({**predicted, "steps": progress.step, "samples_seen": meter.samples, "preempted": preempted,
                "skipped_steps": [s for s, _ in guard.skipped],
                "resumed_from": progress.resumed_from,
                "tokens_per_second": meter.tokens / seconds,
                "padded_tokens_per_second": meter.padded / seconds,
                "padding_efficiency": meter.tokens / max(1, meter.padded),
                "real_tokens": meter.tokens, "padded_tokens": meter.padded,
                "initial_loss": progress.first_loss, "final_loss": last.get("loss"),
                "final_accept_est": last.get("accept_est"),
                "warmup_shapes": [w.as_list() for w in self.shapes.warm],
                **monitor.report(), "warmup": {**self.shapes.report(), **warmed},
                "strategy": self.planner.strategy, "buckets": self.boundaries.tolist(),
                "seed": int(self.cfg.seed), "loss_norm": self.train_step.objective.norm,
                "loss_batch_weight": self.train_step.objective.batch_weight,
                "train_seconds": seconds, "epochs": int(self.cfg.epochs),
                "eval_curve": progress.eval_curve,
                "eval_seconds_during_training": meter.excluded,
                "world_size": self.topo.world_size, "replica_digests": replica_digests(self.drafter.state_dict(), self.topo),
                "batches_per_epoch": self.planner.epoch(0).num_batches,
                "steps_per_epoch": self.steps_per_epoch, "pipeline_depth": depth,
                "stage_ms": {k: v for k, v in last.items() if k.startswith("time_")},
                "data": self.sources.data.info,
                "target_dir": self.sources.target_dir, "model": self.model_record()})

    def model_record(self) -> dict:
        """What was trained, read off the models themselves (a local target's sizes are
        its config.json's, whatever the model group's defaults say)."""
        spec, t, vocab = self.drafter.spec, self.target, self.train_step.objective.vocab
        cache = self.train_step.feature_cache
        return {"target_hidden_size": int(t.hidden_size), "target_layers": len(t.base.layers),
                "vocab_size": int(t.vocab_size), "target_layer_ids": list(spec.target_layer_ids),
                "drafter_layers": spec.num_layers,
                "layer_types": list(spec.layer_types) or ["full_attention"] * spec.num_layers,
                "sliding_window": spec.sliding_window, "causal": spec.causal,
                "block_size": spec.block_size, "mask_token_id": spec.mask_token_id,
                "markov_rank": spec.markov_rank, "confidence_head": spec.confidence_head,
                "sample_from_anchor": spec.sample_from_anchor,
                "anchor_slots": int(self.num_anchors), "loss": self.train_step.objective.kind,
                "draft_vocab": None if vocab is None else {"size": len(vocab),
                                                           "coverage": vocab.coverage},
                "target_cache": None if cache is None else {
                    "samples": len(cache.rows), "mb": round(cache.bytes / 2**20, 1),
                    "hits": cache.hits, "misses": cache.misses}}

    def next_position(self, batch) -> tuple[int, int]:
        """(epoch, batch index) of the batch after this one: where a resume starts."""
        if batch.index + 1 >= self.epoch_steps(batch.epoch):
            return batch.epoch + 1, 0
        return batch.epoch, batch.index + 1

    def warm(self) -> dict:
        """Every warm shape through the real step, rank 0 first (it fills the caches)."""
        if not self.shapes.warm:
            return {"seconds": 0.0, "per_shape": []}
        vocab = int(self.target.vocab_size)
        return warm_ranks(self.topo, lambda: warm(
            self.train_step, self.shapes.warm, vocab, self.topo.drafter_device,
            progress=bool(self.cfg.logger.progress and self.topo.is_main),
            packed=self.planner.packs_rows))

def _autotuners() -> list:
    """Autotuned kernels already loaded (importing Triton just to count them is waste)."""
    import sys
    mod = sys.modules.get("dflash.kernels.ce_triton")
    return mod.autotuners() if mod is not None else []
