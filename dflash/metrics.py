"""Training metrics without per-step host syncs, and the guard against NaN/inf steps.

    StepMetrics    device sums of the step metrics; `flush()` is the one host sync
    Meter          what the trainer logs: interval means, run totals, stage timings,
                   tokens/s over training time (evaluation time excluded)
    NonFiniteGuard optim.nonfinite: which step went non-finite, named at the sync;
                   skipped steps counted against optim.max_skips
"""
from __future__ import annotations

import math
import time

import torch

from dflash.errors import DataError
from dflash.pipeline import DrafterClock, StageTimes


class StepMetrics:
    """Sums step metrics on the device; `flush()` is the only host synchronisation."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.sums = None
        self.steps = 0
        self.tokens = 0  # real tokens (known on the host from the plan)
        self.padded = 0
        self.samples = 0
        self.lr = 0.0

    def add(self, m: dict, batch, padded_tokens: int | None = None) -> None:
        """`padded_tokens`: the slots the step computed (its run shape), when not the
        batch's natural shape."""
        vec = torch.cat([torch.stack([m["loss"], m["accept_est"], m["grad_norm"]]), m["acc"]])
        self.sums = vec if self.sums is None else self.sums + vec
        self.steps += 1
        self.tokens += int(batch.num_tokens)
        self.padded += int(batch.padded_tokens if padded_tokens is None else padded_tokens)
        self.samples += batch.batch_size
        self.lr = float(m["lr"])

    def flush(self) -> dict:
        """Means since the last flush (one device -> host copy), then start afresh."""
        if not self.steps:
            return {}
        v = (self.sums / self.steps).tolist()
        rec = {"loss": v[0], "accept_est": v[1], "grad_norm": v[2],
               "acc": [round(x, 4) for x in v[3:]], "lr": self.lr, "steps": self.steps,
               "tokens": self.tokens, "padded_tokens": self.padded, "samples": self.samples,
               "padding_efficiency": self.tokens / max(1, self.padded)}
        self.reset()
        return rec


class Meter:
    """Interval metrics since the last sync, run totals (real / padded tokens, samples:
    known on the host from the plan) and per-stage timings."""

    def __init__(self, every: int, total_steps: int, device: torch.device,
                 totals: tuple[int, int, int] = (0, 0, 0), predict=None):
        self.every, self.total_steps = max(1, int(every)), int(total_steps)
        self.interval, self.times = StepMetrics(), StageTimes()
        self.clock = DrafterClock(device)
        self.tokens, self.padded, self.samples = (int(x) for x in totals)
        self.t0 = time.perf_counter()
        self.t_flush = self.t0  # measured step time: wall clock between syncs
        self.excluded = 0.0  # seconds spent evaluating during training
        self.last: dict = {}
        # predict(shape) -> seconds from a step cost file (None: no prediction)
        self.predict = predict
        self.predicted_interval = self.predicted_total = 0.0

    @property
    def totals(self) -> tuple[int, int, int]:
        return self.tokens, self.padded, self.samples

    def add(self, m: dict, item) -> None:
        self.times.add(item.times)
        self.interval.add(m, item.batch, item.shape.tokens)
        self.tokens += int(item.batch.num_tokens)
        self.padded += int(item.shape.tokens)
        self.samples += item.batch.batch_size
        if self.predict is not None:
            p = self.predict(item.shape)
            self.predicted_interval += p
            self.predicted_total += p

    def due(self, step: int) -> bool:
        return step == 1 or step % self.every == 0 or step == self.total_steps

    def flush(self, epoch: int) -> dict:
        """Interval means (one device -> host copy), stage times and rates so far."""
        rec = self.interval.flush()
        rec.update(self.times.flush(self.clock))
        now, steps = time.perf_counter(), max(1, rec.get("steps", 0))
        rec["step_seconds"] = (now - self.t_flush) / steps
        self.t_flush = now
        if self.predict is not None:
            rec["predicted_step_seconds"] = self.predicted_interval / steps
            self.predicted_interval = 0.0
        elapsed = self.elapsed()
        rec.update(epoch=epoch, tokens_per_second=self.tokens / elapsed,
                   padded_tokens_per_second=self.padded / elapsed, elapsed=elapsed)
        self.last = rec
        return rec

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def exclude(self, seconds: float) -> None:
        """Time spent on something other than training (evaluation) does not count."""
        self.t0 += seconds
        self.t_flush += seconds
        self.excluded += seconds


class NonFiniteGuard:
    """optim.nonfinite=stop: a NaN/inf found at the sync names the first such step since
    the previous sync; =skip: the step made no update, and more than max_skips stop."""

    def __init__(self, max_skips: int):
        self.max_skips = int(max_skips)
        self.recent: list = []  # (step, batch, loss, grad_norm) since the last sync
        self.skipped: list = []  # (step, batch)

    def add(self, step: int, batch, m: dict) -> dict:
        self.recent.append((step, batch, m["loss"], m["grad_norm"]))
        if not m["skipped"]:
            return m
        self.skipped.append((step, batch))
        if len(self.skipped) > self.max_skips:
            raise DataError(f"{len(self.skipped)} steps had a NaN/inf loss or gradient, more "
                            f"than optim.max_skips={self.max_skips}: "
                            + "; ".join(where(s, b) for s, b in self.skipped[-3:]))
        return {k: torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0)
                if isinstance(v, torch.Tensor) else v for k, v in m.items()}

    def check(self, rec: dict) -> None:
        """At a sync: stop on a non-finite interval, naming the step that went first."""
        if not (math.isfinite(rec["loss"]) and math.isfinite(rec["grad_norm"])):
            raise DataError(self._first_nonfinite())
        self.recent = []

    def _first_nonfinite(self) -> str:
        vals = torch.stack([torch.stack([lo.float(), g.float()])
                            for _, _, lo, g in self.recent]).tolist()
        for (step, batch, _, _), (lo, g) in zip(self.recent, vals):
            if not (math.isfinite(lo) and math.isfinite(g)):
                return (f"NaN/inf {'loss' if not math.isfinite(lo) else 'gradient norm'} at "
                        f"{where(step, batch)}; optim.nonfinite=skip skips such steps "
                        f"(up to optim.max_skips)")
        return "NaN/inf in the metrics since the last sync"


def where(step: int, batch) -> str:
    ids = [int(i) for i in batch.sample_ids[:8]]
    more = "..." if batch.batch_size > 8 else ""
    return f"step {step} (epoch {batch.epoch}, batch {batch.index}, samples {ids}{more})"
