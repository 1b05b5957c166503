"""What a training run reports: the fields of `summary.json`, as one typed record.

`Trainer.train` fills the training fields, `Trainer.run` adds the evaluation and the
run's identity. A key not declared here is refused (`check_summary`, run on every
summary a run writes), so a field cannot appear or be renamed unseen; readers (the
comparison, the printed table, the real-model recipe) take `RunSummary.from_json` and
read fields. A field a run did not fill (a preempted run's evaluation) is None.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from dflash.records import declared


@dataclass
class RunSummary:
    # ---- training (Trainer.train) ----
    steps: Optional[int] = None  # optimizer steps taken (this run, resumed ones included)
    samples_seen: Optional[int] = None
    preempted: Optional[str] = None  # the signal that stopped the run (checkpointed), else None
    requeued: Optional[bool] = None  # preempted under SLURM: whether the job was requeued
    skipped_steps: Optional[list] = None  # steps whose update was skipped (optim.nonfinite=skip)
    resumed_from: Optional[str] = None  # the checkpoint this run started from
    tokens_per_second: Optional[float] = None  # real (unpadded) tokens per second of training
    padded_tokens_per_second: Optional[float] = None
    padding_efficiency: Optional[float] = None  # real / padded tokens
    real_tokens: Optional[int] = None
    padded_tokens: Optional[int] = None
    initial_loss: Optional[float] = None
    final_loss: Optional[float] = None
    final_accept_est: Optional[float] = None  # the loss's expected acceptance on the last batch
    predicted_train_seconds: Optional[float] = None  # with cost=FILE: the step cost model's prediction
    warmup_shapes: Optional[list] = None  # [rows, length, anchors] of each warmed shape
    compiles_after_warmup: Optional[int] = None
    compile_events: Optional[list] = None
    warmup: Optional[dict] = None  # the warm-up policy's report (shapes, coverage, seconds per shape)
    strategy: Optional[str] = None
    buckets: Optional[list] = None  # bucket boundaries
    seed: Optional[int] = None
    loss_norm: Optional[str] = None
    loss_batch_weight: Optional[float] = None
    train_seconds: Optional[float] = None  # training time (evaluation during training excluded)
    epochs: Optional[int] = None
    eval_curve: Optional[list] = None  # eval.every_steps: acceptance during training
    eval_seconds_during_training: Optional[float] = None
    world_size: Optional[int] = None
    replica_digests: Optional[list] = None  # every rank's drafter digest: equal, or the run fails
    batches_per_epoch: Optional[int] = None
    steps_per_epoch: Optional[int] = None
    pipeline_depth: Optional[int] = None
    stage_ms: Optional[dict] = None  # the last synced step's stage times (target, drafter, waits)
    data: Optional[dict] = None  # the data source's report (samples, overlong policy, held out)
    target_dir: Optional[str] = None
    model: Optional[dict] = None  # what was trained, read off the models (sizes, taps, layout, loss)
    # ---- evaluation and identity (Trainer.run) ----
    initial_acceptance_length: Optional[float] = None
    acceptance_length: Optional[float] = None
    acceptance: Optional[dict] = None  # train / held-out / decode-path / decoded acceptance
    eval: Optional[dict] = None  # before / after reports, prompts, tokens
    pair_repeat_rate: Optional[float] = None  # plan quality: same pair of samples batched in two epochs
    length_mixing: Optional[float] = None
    plan_padding_efficiency: Optional[float] = None
    run_name: Optional[str] = None
    group: Optional[str] = None
    overrides: Optional[list] = None
    wall_seconds: Optional[float] = None


    @classmethod
    def from_json(cls, d: dict) -> "RunSummary":
        """A written summary as a record (keys a later dflash no longer declares are
        not read)."""
        return cls(**declared(cls, d))


FIELDS = frozenset(f.name for f in dataclasses.fields(RunSummary))


def check_summary(summary: dict) -> dict:
    """`summary`, refused if it holds a key RunSummary does not declare."""
    extra = sorted(set(summary) - FIELDS)
    if extra:
        raise KeyError(f"summary keys not declared in dflash/run_summary.py: {extra}")
    return summary



def from_training(progress, meter, skipped: list, preempted: str | None) -> dict:
    """The fields the training loop measured: its Progress (steps, losses, the eval
    curve), its Meter (tokens, time, the last synced interval) and the skipped steps."""
    seconds, last = meter.elapsed(), meter.last
    out = {"predicted_train_seconds": meter.predicted_total} if meter.predict else {}
    out.update({
        "steps": progress.step, "samples_seen": meter.samples, "preempted": preempted,
        "skipped_steps": [s for s, _ in skipped], "resumed_from": progress.resumed_from,
        "tokens_per_second": meter.tokens / seconds,
        "padded_tokens_per_second": meter.padded / seconds,
        "padding_efficiency": meter.tokens / max(1, meter.padded),
        "real_tokens": meter.tokens, "padded_tokens": meter.padded,
        "initial_loss": progress.first_loss, "final_loss": last.get("loss"),
        "final_accept_est": last.get("accept_est"), "train_seconds": seconds,
        "eval_curve": progress.eval_curve, "eval_seconds_during_training": meter.excluded,
        "stage_ms": {k: v for k, v in last.items() if k.startswith("time_")}})
    return out


def with_eval(summary: dict, before: dict, after: dict, gap: dict | None, num_prompts: int,
              eval_cfg) -> dict:
    """`summary` with the held-out measurements before and after training."""
    summary.update({
        "initial_acceptance_length": before.get("acceptance_length"),
        "acceptance_length": after.get("acceptance_length"), "acceptance": gap,
        "eval": {"before": before, "after": after, "num_prompts": num_prompts,
                 "max_new_tokens": int(eval_cfg.max_new_tokens),
                 "temperature": float(eval_cfg.temperature)}})
    return summary
