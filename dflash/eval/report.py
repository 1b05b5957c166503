"""What `python -m dflash.eval` reports, as typed records (its `out=` JSON is their
`to_json`; readers - the recipe's summary, the llama.cpp check, the printed table - take
`from_json` and read fields, not string keys).

    Difference   a paired difference of pooled acceptance, with its 95% interval
    Score        acceptance over prompts (or replies): pooled, per prompt, verify steps
    Baseline     a baseline's Score and the drafter's paired difference to it
    PathsReport  the walk along held-out greedy replies (`paths=`)
    EvalReport   the whole report: decoded prompts, baselines, paths, speed
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from dflash.records import declared, to_json


@dataclass
class Difference:
    difference: float
    lo: float
    hi: float
    better: bool  # the interval lies above 0

    @classmethod
    def from_json(cls, d: dict) -> "Difference":
        return cls(**declared(cls, d))


@dataclass
class Score:
    acceptance_length: float
    per_prompt: list
    per_prompt_steps: list
    verify_steps: int
    generated_tokens: Optional[int] = None  # decoded (none along known replies)
    interval: Optional[dict] = None  # 95% bootstrap over prompts: lo, hi, half_width

    OMIT_NONE = ("generated_tokens", "data")

    @classmethod
    def from_json(cls, d: dict) -> "Score":
        return cls(**declared(Score, d))

    def to_json(self) -> dict:
        return to_json(self)


@dataclass
class Baseline(Score):
    drafter_minus_this: Optional[Difference] = None

    @classmethod
    def from_json(cls, d: dict) -> "Baseline":
        out = cls(**declared(cls, d))
        out.drafter_minus_this = Difference.from_json(d["drafter_minus_this"])
        return out


def baselines_from_json(d: dict | None) -> dict:
    return {name: Baseline.from_json(b) for name, b in (d or {}).items()}


@dataclass
class PathsReport(Score):
    replies: int = 0
    baselines: dict = field(default_factory=dict)  # name -> Baseline
    data: Optional[str] = None

    @classmethod
    def from_json(cls, d: dict) -> "PathsReport":
        out = cls(**declared(cls, d))
        out.baselines = baselines_from_json(d.get("baselines"))
        return out


@dataclass
class EvalReport:
    drafter: str
    # decoded prompts (`prompts=`): the fields of Score, and what reproduces them
    prompts: Optional[str] = None
    format: Optional[str] = None
    temperature: Optional[float] = None
    confidence_stop: Optional[float] = None
    max_new_tokens: Optional[int] = None
    acceptance_length: Optional[float] = None
    per_prompt: Optional[list] = None
    per_prompt_steps: Optional[list] = None
    histogram: Optional[list] = None  # verify steps that accepted k tokens, k = 1..block
    verify_steps: Optional[int] = None
    generated_tokens: Optional[int] = None
    # the prompts and generated tokens themselves: losslessness can be checked from the
    # report (greedy: they are the target's own greedy continuation)
    prompt_ids: Optional[list] = None
    tokens: Optional[list] = None
    # drafts accepted by each prompt's final verify step: where another engine's count
    # may differ (it ends at the token cap or EOS inside that step; the llama.cpp check)
    per_prompt_last_step_accepted: Optional[list] = None
    interval: Optional[dict] = None
    calibration: Optional[dict] = None  # a drafter with a confidence head
    baselines: Optional[dict] = None  # name -> Baseline
    paths: Optional[PathsReport] = None  # `paths=`
    speed: Optional[dict] = None  # `speed=true`

    OMIT_NONE = ("prompts", "format", "temperature", "confidence_stop", "max_new_tokens",
                 "acceptance_length", "per_prompt", "per_prompt_steps", "histogram",
                 "verify_steps", "generated_tokens", "prompt_ids", "tokens",
                 "per_prompt_last_step_accepted", "interval", "calibration", "baselines",
                 "paths", "speed")

    @property
    def decoded(self) -> bool:
        return self.acceptance_length is not None

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, d: dict) -> "EvalReport":
        out = cls(**declared(cls, d))
        out.baselines = baselines_from_json(d.get("baselines")) if "baselines" in d else None
        out.paths = PathsReport.from_json(d["paths"]) if d.get("paths") else None
        return out
