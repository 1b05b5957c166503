"""What the real-model recipe will take on this machine, measured before its long stages,
and the recipe scaled to a time budget.

The probe runs the recipe's own apps on a sample: the target answers `n` training
prompts (regenerate, the recipe's settings: its tokens/s and reply length), prepare
turns them into token data (tokens a sample), and the train app takes a few steps on it
with the recipe's training config (real tokens/s). The long stages are then priced:

    regenerate  (prompts + paths) x reply tokens / the probe's tokens/s
    train       epochs x prompts x tokens a sample / the probe's training tokens/s

Both are upper bounds: the recipe's regenerate batches are larger than the probe's, and
training after its first epoch reads the target's context from its cache. eval, paths
and the llama.cpp stage are not priced. With a budget (`budget_minutes=`), prompts and
paths are scaled down together (both stages are linear in them) and the recipe says so.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

MIN_PROMPTS = 64  # fewer replies than this train nothing worth measuring


@dataclass
class Estimate:
    regen_tokens_per_second: float
    reply_tokens: float  # mean generated tokens a reply
    sample_tokens: float  # mean tokens a prepared sample
    train_tokens_per_second: float
    prompts: int
    paths: int
    epochs: int

    @property
    def regenerate_seconds(self) -> float:
        return (self.prompts + self.paths) * self.reply_tokens / self.regen_tokens_per_second

    @property
    def train_seconds(self) -> float:
        return self.epochs * self.prompts * self.sample_tokens / self.train_tokens_per_second

    @property
    def seconds(self) -> float:
        return self.regenerate_seconds + self.train_seconds

    def scaled(self, budget_minutes: float | None) -> tuple[int, int]:
        """(prompts, paths) that fit `budget_minutes` (unchanged when they fit)."""
        if not budget_minutes or self.seconds <= 60 * budget_minutes:
            return self.prompts, self.paths
        f = 60 * float(budget_minutes) / self.seconds
        return max(MIN_PROMPTS, math.floor(self.prompts * f)), math.floor(self.paths * f)

    def with_counts(self, prompts: int, paths: int) -> "Estimate":
        return Estimate(**{**asdict(self), "prompts": prompts, "paths": paths})

    def lines(self) -> str:
        return (f"regenerate ~{self.regenerate_seconds / 60:.0f} min ({self.prompts + self.paths} "
                f"replies x {self.reply_tokens:.0f} tokens at {self.regen_tokens_per_second:.0f} "
                f"tok/s), train ~{self.train_seconds / 60:.0f} min ({self.epochs} epochs x "
                f"{self.prompts} samples x {self.sample_tokens:.0f} tokens at "
                f"{self.train_tokens_per_second:.0f} tok/s): ~{self.seconds / 60:.0f} min "
                "(upper bounds; eval, paths and llama.cpp not priced)")


def probe(work: Path, sample: list, run_app, model: list, regen_keys: list, train_keys: list,
          max_new_tokens: int, steps: int = 4) -> dict:
    """The recipe's apps on `sample` (chat prompts) under work/: their measured rates."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sample))
    run_app("dflash.regenerate", [f"inputs=[{work / 'prompts.jsonl'}]", f"out={work / 'replies.jsonl'}",
                                  *model, f"max_new_tokens={max_new_tokens}", "progress=false",
                                  f"hydra.run.dir={work / 'regenerate'}", *regen_keys])
    regen = json.loads((work / "replies.jsonl.report.json").read_text())
    tgt = next(k.split("=", 1)[1] for k in model if k.startswith("model.target.path="))
    run_app("dflash.data.prepare", ["--jsonl", work / "replies.jsonl", "--tokenizer", tgt,
                                    "--out", work / "data"])
    prep = json.loads((work / "data" / "prepare_report.json").read_text())
    run_app("dflash.train", [*model, "data=tokenized", f"data.path={work / 'data'}",
                             "eval.enabled=false", "logger.progress=false", *train_keys,
                             f"optim.max_steps={steps}", f"hydra.run.dir={work / 'train'}"])
    train = json.loads((work / "train" / "summary.json").read_text())
    return {"regen_tokens_per_second": float(regen["tokens_per_second"]),
            "reply_tokens": regen["generated_tokens"] / max(1, regen["conversations_written"]),
            "sample_tokens": prep["tokens"] / max(1, prep["samples"]),
            "train_tokens_per_second": float(train["tokens_per_second"])}
