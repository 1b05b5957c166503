"""Every file of the recipe's workdir, named once."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Workdir:
    root: Path

    def __truediv__(self, name: str) -> Path:
        return self.root / name

    # prompts (stage prompts)
    @property
    def prompts(self) -> Path:  # training prompts
        return self.root / "prompts.jsonl"

    @property
    def heldout(self) -> Path:  # decoded held-out prompts
        return self.root / "heldout.jsonl"

    @property
    def heldout_paths(self) -> Path:  # held-out prompts whose greedy replies are walked
        return self.root / "heldout_paths.jsonl"

    # the target's replies and the data prepared from them
    @property
    def replies(self) -> Path:
        return self.root / "replies.jsonl"

    @property
    def replies_report(self) -> Path:  # regenerate's report on the training replies
        return self.root / "replies.jsonl.report.json"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def heldout_replies(self) -> Path:
        return self.root / "heldout_replies.jsonl"

    @property
    def heldout_data(self) -> Path:
        return self.root / "heldout_data"

    def train_run(self, digest: str) -> Path:  # one run dir per training config
        return self.root / f"train-{digest}"

    # what the later stages measured
    @property
    def estimate(self) -> Path:
        return self.root / "estimate.json"

    @property
    def eval(self) -> Path:
        return self.root / "eval.json"

    @property
    def eval_draft_head(self) -> Path:
        return self.root / "eval_draft_head.json"

    @property
    def paths(self) -> Path:
        return self.root / "paths.json"

    @property
    def llama_cpp(self) -> Path:
        return self.root / "llama_cpp.json"

    @property
    def llama_cpp_draft_head(self) -> Path:
        return self.root / "llama_cpp_draft_head.json"

    @property
    def speed(self) -> Path:
        return self.root / "speed.json"

    @property
    def untrained_drafter(self) -> Path:
        return self.root / "untrained_drafter"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"
