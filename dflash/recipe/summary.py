"""What the recipe measured, gathered into `workdir/summary.json` and printed.

It reads each stage's report as its record (RunSummary, EvalReport, ServingCheck) and
writes one RecipeSummary; the printed lines read that record's fields.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Optional

from dflash.eval.report import Difference, EvalReport
from dflash.recipe.engine_speed import SpeedReport
from dflash.recipe.llama_cpp import ServingCheck
from dflash.recipe.workdir import Workdir
from dflash.run_summary import RunSummary

BASELINE_ORDER = ("untrained", "lookup", "ngram")
REGENERATE_FIELDS = ("conversations_written", "generated_tokens", "generated_tokens_this_run",
                     "tokens_per_second", "truncated", "decoding")


@dataclass
class Versus:
    acceptance_length: float
    drafter_minus_this: Difference


@dataclass
class Comparison:
    """The drafter's acceptance and each baseline's, with the paired difference."""
    drafter: float
    interval: Optional[dict] = None
    baselines: dict = field(default_factory=dict)  # name -> Versus
    replies: Optional[int] = None  # the walk along greedy replies: how many

    @classmethod
    def of(cls, report, replies: int | None = None) -> "Comparison":
        """From an EvalReport or a PathsReport."""
        return cls(report.acceptance_length, report.interval,
                   {n: Versus(b.acceptance_length, b.drafter_minus_this)
                    for n, b in (report.baselines or {}).items()}, replies)

    def to_json(self) -> dict:
        head = {"replies": self.replies} if self.replies is not None else {}
        return {**head, "drafter": self.drafter, "interval": self.interval,
                **{n: dataclasses.asdict(v) for n, v in self.baselines.items()}}


@dataclass
class TrainFigures:
    steps: int
    tokens_per_second: float
    initial_loss: float
    final_loss: float
    uniform_loss: float  # ln(the ids the training softmax spans): the first loss's yardstick
    stage_ms: dict
    model: dict

    @classmethod
    def of(cls, s: RunSummary) -> "TrainFigures":
        vocab = int((s.model.get("draft_vocab") or {}).get("size") or s.model["vocab_size"])
        return cls(s.steps, s.tokens_per_second, s.initial_loss, s.final_loss, math.log(vocab),
                   s.stage_ms, s.model)


@dataclass
class RecipeSummary:
    stage_seconds: dict
    total_seconds: float
    regenerate: dict  # regenerate's report: replies, tokens, tokens/s, truncated, decoding
    train: TrainFigures
    eval: Comparison
    paths: Optional[Comparison] = None
    llama_cpp_draft_head: Optional[ServingCheck] = None
    speed: Optional[SpeedReport] = None  # llama-server's speed (dflash.recipe.engine_speed)
    llama_cpp: Optional[ServingCheck] = None

    def to_json(self) -> dict:
        out = {"stage_seconds": self.stage_seconds, "total_seconds": self.total_seconds,
               "regenerate": self.regenerate, "train": dataclasses.asdict(self.train),
               "eval": self.eval.to_json()}
        if self.paths is not None:
            out["paths"] = self.paths.to_json()
        if self.llama_cpp_draft_head is not None:
            out["llama_cpp_draft_head"] = self.llama_cpp_draft_head.to_json()
        if self.speed is not None:
            out["speed"] = self.speed.to_json()
        if self.llama_cpp is not None:
            out["llama_cpp"] = self.llama_cpp.to_json()
        return out


def _check(path) -> ServingCheck | None:
    if not path.exists():
        return None
    # the prompt-by-prompt rows stay in their own file
    return ServingCheck.from_json({**json.loads(path.read_text()), "per_prompt": None})


def summarize(work: Workdir, run_dir, seconds: dict) -> RecipeSummary:
    regen = json.loads(work.replies_report.read_text())
    train = RunSummary.from_json(json.loads((run_dir / "summary.json").read_text()))
    ev = EvalReport.from_json(json.loads(work.eval.read_text()))
    paths = None
    if work.paths.exists():  # the walk along many more held-out replies
        p = EvalReport.from_json(json.loads(work.paths.read_text())).paths
        paths = Comparison.of(p, p.replies)
    out = RecipeSummary(seconds, sum(seconds.values()), {k: regen[k] for k in REGENERATE_FIELDS},
                        TrainFigures.of(train), Comparison.of(ev), paths,
                        _check(work.llama_cpp_draft_head),
                        SpeedReport.from_json(json.loads(work.speed.read_text()))
                        if work.speed.exists() else None,
                        _check(work.llama_cpp))
    work.summary.write_text(json.dumps(out.to_json(), indent=2))
    return out


def format_summary(s: RecipeSummary) -> str:
    t, r, e = s.train, s.regenerate, s.eval
    lines = ["stage seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in s.stage_seconds.items())
             + f" (total {s.total_seconds / 60:.1f} min)",
             f"regenerate: {r['conversations_written']} replies, {r['generated_tokens']:,} "
             + (f"tokens at {r['tokens_per_second']:.1f} tok/s ({r['decoding']}), "
                if r["generated_tokens_this_run"] else "tokens (every batch resumed from its part), ")
             + f"{r['truncated']} cut at max_new_tokens",
             f"train: {t.steps} steps, {t.tokens_per_second:.0f} real tok/s, loss "
             f"{t.initial_loss:.2f} -> {t.final_loss:.2f} (uniform over the softmax's ids = "
             f"{t.uniform_loss:.2f})",
             f"eval (held-out prompts, decoded): drafter acceptance {e.drafter:.3f}",
             *_versus(e)]
    if s.paths is not None:
        p = s.paths
        lines += [f"paths ({p.replies} more held-out prompts, along the target's greedy "
                  f"replies): drafter acceptance {p.drafter:.3f}", *_versus(p)]
    from dflash.recipe.llama_cpp import format_check
    if s.llama_cpp is not None:
        lines.append(format_check(s.llama_cpp))
    if s.llama_cpp_draft_head is not None:
        lines.append("draft head: " + format_check(s.llama_cpp_draft_head))
    if s.speed is not None:
        from dflash.recipe.engine_speed import format_table
        lines += ["llama-server speed, greedy, on the held-out prompts:",
                  *[format_table(run) for run in s.speed.runs]]
    return "\n".join(lines)


def _versus(c: Comparison) -> list:
    """The drafter against each baseline, one line each."""
    lines = []
    for name in BASELINE_ORDER:
        if name in c.baselines:
            v = c.baselines[name]
            d = v.drafter_minus_this
            lines.append(f"  vs {name:<9} {v.acceptance_length:.3f}: drafter "
                         f"{d.difference:+.3f} (95% CI {d.lo:+.3f} to {d.hi:+.3f})"
                         f"{'' if d.better else '  not measurably better'}")
    return lines
