"""What drafts a verify block: one `Proposer` protocol for every drafter the decoder runs.

    DrafterProposer   the DFlash / DSpark drafter over the target's context (drafter.py)
    TokenProposer     token ids without a distribution and without the target's context:
      HistoryProposer   from each row's own history (n-gram table, prompt lookup)
      PlainProposer     no drafts (plain greedy decoding through the same session)
      AdaptiveProposer  plain or lookup, whichever measures faster (adaptive.py)

The decoder asks nothing else of a proposer: its block size, whether the target session
keeps the drafter's context for it, a `Proposal` a step, and each step's tokens and time.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

import torch


class Proposal(NamedTuple):
    drafts: torch.Tensor  # [B, k] token ids after each row's current token
    # [B, k, V] the distributions the drafts were sampled from; None: greedy or token ids
    # (the rejection rule then reads them as one-hot)
    q: torch.Tensor | None = None
    limit: torch.Tensor | None = None  # [B] drafts each row proposes (a confidence stop)


class Proposer(Protocol):
    block_size: int  # the verify block: the current token + up to block_size - 1 drafts
    needs_context: bool  # the session keeps the target's tapped hidden states for it
    name: str  # what drafts, for reports (drafter | lookup | plain | ngram | auto (...))

    def propose(self, session, current: torch.Tensor, temperature: float,
                gen: torch.Generator) -> Proposal: ...

    def observe(self, tokens: int, seconds: float) -> None:
        """One verify step's emitted tokens (all rows) and its wall time."""


def sample(probs: torch.Tensor, generator) -> torch.Tensor:
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class TokenProposer:
    """Drafts token ids only (no distribution, no target context)."""
    block_size = 16
    needs_context = False

    def drafts(self, session, current: torch.Tensor) -> torch.Tensor:
        """[B, k] drafts after each row's current token."""
        raise NotImplementedError

    def propose(self, session, current, temperature, gen) -> Proposal:
        return Proposal(self.drafts(session, current))

    def observe(self, tokens: int, seconds: float) -> None:
        pass


class HistoryProposer(TokenProposer):
    """Drafts from each row's committed tokens and its current one (`draft(history)`)."""

    def draft(self, history: list) -> list:
        """The block's drafts after `history` (its last token is the anchor)."""
        raise NotImplementedError

    def drafts(self, session, current: torch.Tensor) -> torch.Tensor:
        rows = [self.draft(session.ids[r, :int(session.lengths[r])].tolist() + [int(current[r])])
                for r in range(len(current))]
        return torch.tensor(rows, dtype=torch.long, device=current.device)


class PlainProposer(TokenProposer):
    """No drafts: every step verifies the current token alone (plain greedy decoding
    through the same session and KV cache as speculative decoding)."""
    block_size = 1
    name = "plain"

    def drafts(self, session, current: torch.Tensor) -> torch.Tensor:
        return current.new_zeros((len(current), 0))
