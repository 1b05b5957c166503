"""What a training run reports: the fields of `summary.json`, as one typed record.

`Trainer.train` fills the training fields, `Trainer.run` adds the evaluation and the
run's identity; the comparison, the W&B summary, the printed table and the real-model
recipe read these keys. A key not declared here is refused (`check_summary`, run on
every summary a run writes), so a field cannot appear or be renamed unseen.
"""
from __future__ import annotations

from typing import Optional, TypedDict


class RunSummary(TypedDict, total=False):
    # ---- training (Trainer.train) ----
    steps: int  # optimizer steps taken (this run, resumed ones included)
    samples_seen: int
    preempted: Optional[str]  # the signal that stopped the run (checkpointed), else None
    requeued: Optional[bool]  # preempted under SLURM: whether the job was requeued
    skipped_steps: list  # steps whose update was skipped (optim.nonfinite=skip)
    resumed_from: Optional[str]  # the checkpoint this run started from
    tokens_per_second: float  # real (unpadded) tokens per second of training
    padded_tokens_per_second: float
    padding_efficiency: float  # real / padded tokens
    real_tokens: int
    padded_tokens: int
    initial_loss: Optional[float]
    final_loss: Optional[float]
    final_accept_est: Optional[float]  # the loss's expected acceptance on the last batch
    predicted_train_seconds: float  # with cost=FILE: the step cost model's prediction
    warmup_shapes: list  # [rows, length, anchors] of each warmed shape
    compiles_after_warmup: int
    compile_events: list
    warmup: dict  # the warm-up policy's report (shapes, coverage, seconds per shape)
    strategy: str
    buckets: list  # bucket boundaries
    seed: int
    loss_norm: str
    loss_batch_weight: float
    train_seconds: float  # training time (evaluation during training excluded)
    epochs: int
    eval_curve: list  # eval.every_steps: acceptance during training
    eval_seconds_during_training: float
    world_size: int
    replica_digests: list  # every rank's drafter digest: equal, or the run fails
    batches_per_epoch: int
    steps_per_epoch: int
    pipeline_depth: int
    stage_ms: dict  # the last synced step's stage times (target, drafter, waits)
    data: dict  # the data source's report (samples, overlong policy, held out)
    target_dir: Optional[str]
    model: dict  # what was trained, read off the models (sizes, taps, layout, loss)
    # ---- evaluation and identity (Trainer.run) ----
    initial_acceptance_length: Optional[float]
    acceptance_length: Optional[float]
    acceptance: Optional[dict]  # train / held-out / decode-path / decoded acceptance
    eval: dict  # before / after reports, prompts, tokens
    pair_repeat_rate: float  # plan quality: same pair of samples batched in two epochs
    length_mixing: float
    plan_padding_efficiency: float
    run_name: str
    group: Optional[str]
    overrides: list
    wall_seconds: float


FIELDS = frozenset(RunSummary.__annotations__)


def check_summary(summary: dict) -> dict:
    """`summary`, refused if it holds a key RunSummary does not declare."""
    extra = sorted(set(summary) - FIELDS)
    if extra:
        raise KeyError(f"summary keys not declared in dflash/run_summary.py: {extra}")
    return summary

