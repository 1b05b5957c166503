"""Drafting only while it pays: a proposer that measures its own tokens/s.

A verify step over a block of k tokens costs the target about k tokens of work where it
is compute-bound (a CPU, a large batch), and emits 1 + accepted drafts. Prompt lookup
on chat replies accepts few drafts (SmolLM2 on 2 CPU cores: blocks of 4 ran at 0.77x
plain decoding), on code edits or quoted text many. Which wins depends on the model,
the data and the device, so `decoding=auto` measures it: steps alternate between plain
(k = 1) and drafted (k = block) until each has `explore` steps, then the faster by
tokens per second (a moving average) runs, and the other is re-tried for `explore`
steps after `recheck` steps, so a change of regime (longer replies, a different kind of
prompt) is followed; each re-check that confirms the winner doubles the interval, so
exploring costs less and less of a long run. Every step is verified by the target, so the output is its greedy
decoding whichever size runs.
"""
from __future__ import annotations

from dflash.decode.proposer import TokenProposer


class AdaptiveProposer(TokenProposer):
    """Wraps a token-id proposer (`drafts(session, current)` -> [B, k-1]); each step
    drafts either nothing (plain decoding) or the inner proposer's block."""

    def __init__(self, inner, explore: int = 4, recheck: int = 128, smoothing: float = 0.2):
        self.inner = inner
        self.block_size = int(inner.block_size)  # the widest block a step may verify
        self.sizes = (1, self.block_size)
        self.explore, self.recheck, self.smoothing = int(explore), int(recheck), float(smoothing)
        self.rate = {k: None for k in self.sizes}  # tokens/s, moving average
        self.steps = {k: 0 for k in self.sizes}
        self.since_check = 0
        self.current = 1
        self.last_best = None

    def choose(self) -> int:
        """The block size of the next step."""
        under = [k for k in self.sizes if self.steps[k] < self.explore]
        if under:  # exploring: alternate so both see the same batches
            others = [k for k in under if k != self.current]
            return others[0] if others else under[0]
        best = max(self.sizes, key=lambda k: self.rate[k])
        if self.since_check >= self.recheck:  # re-try the other one
            other = [k for k in self.sizes if k != best][0]
            self.steps[other] = 0
            self.since_check = 0
            if best == self.last_best:  # confirmed again: check half as often
                self.recheck *= 2
            self.last_best = best
            return other
        return best

    def drafts(self, session, current):
        self.current = self.choose()
        self.since_check += 1
        if self.current == 1:
            return current.new_empty((len(current), 0))
        return self.inner.drafts(session, current)

    def observe(self, tokens: int, seconds: float) -> None:
        """One step's emitted tokens (all rows) and wall time."""
        k = self.current
        r = tokens / max(seconds, 1e-9)
        self.rate[k] = r if self.rate[k] is None else \
            (1 - self.smoothing) * self.rate[k] + self.smoothing * r
        self.steps[k] += 1

    @property
    def name(self) -> str:
        return f"auto ({self.choice})"

    @property
    def choice(self) -> str:
        """What the measurements say so far: 'plain' or 'lookup'."""
        if any(v is None for v in self.rate.values()):
            return "undecided"
        return "plain" if self.rate[1] >= self.rate[self.block_size] else "lookup"
