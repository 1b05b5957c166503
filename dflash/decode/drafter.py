"""The DFlash (and DSpark) drafter as a proposer: one forward drafts the whole block."""
from __future__ import annotations

import torch

from dflash.decode.proposer import Proposal, sample
from dflash.errors import ConfigError
from dflash.model.dspark import first_slot, markov_chain, num_drafts
from dflash.model.loss import block_embeddings


class DrafterProposer:
    """The DFlash drafter: one forward drafts the whole block from the target context;
    a DSpark drafter's Markov head then chains the slots (each biased by the token the
    slot before chose, its argmax), and its confidence head may stop the block at the
    first slot below `confidence_stop` (llama.cpp's `--spec-draft-p-min`).
    `zero_context=True` multiplies the context by zero (the ablation that shows how much
    the drafter relies on the target)."""

    needs_context = True
    name = "drafter"

    def __init__(self, drafter, target, zero_context: bool = False, confidence_stop: float = 0.0):
        self.drafter, self.target, self.zero = drafter, target, zero_context
        self.first = first_slot(drafter.spec)
        self.block_size = num_drafts(drafter.spec) + 1  # the verify block: anchor + drafts
        self.confidence_stop = float(confidence_stop)
        if self.confidence_stop > 0 and drafter.confidence_head is None:
            raise ConfigError(f"confidence_stop={confidence_stop}: this drafter has no confidence "
                              "head (model.drafter.confidence_head); set it to 0")

    @torch.no_grad()
    def logits(self, session, current: torch.Tensor) -> torch.Tensor:
        """[B, n, V] draft logits of the block anchored at each row's current token
        (a DSpark drafter's: Markov-biased along its greedy chain)."""
        return self._draft(session, current)[0]

    def _draft(self, session, current):
        width = int(session.lengths.max())
        ctx = session.ctx[:, :width]
        if self.zero:
            ctx = ctx * 0
        valid = torch.arange(width, device=ctx.device)[None, :] < session.lengths[:, None]
        anchors = session.lengths[:, None]
        spec = self.drafter.spec
        emb = block_embeddings(self.target.embed_tokens, current[:, None],
                               torch.zeros_like(anchors), spec.block_size, spec.mask_token_id)
        h = self.drafter(ctx, valid, anchors, torch.ones_like(anchors, dtype=torch.bool), emb)
        h = h[:, 0, self.first:]
        head = self.drafter.draft_head
        if head is not None:  # an exported draft vocabulary: its rows only
            dl = head.logits(h)
        else:
            dl = (h.to(self.target.lm_head_weight.dtype) @ self.target.lm_head_weight.t()).float()
        mh, prev = self.drafter.markov_head, None
        if mh is not None:
            dl, prev = markov_chain(dl, current, mh, dl.shape[-1])
        return dl, h, prev

    @torch.no_grad()
    def propose(self, session, current: torch.Tensor, temperature: float, gen) -> Proposal:
        """(drafts [B, n], their distributions q [B, n, V] or None when greedy, drafts each
        row may keep [B] or None): the block anchored at each row's current token."""
        dl, h, prev = self._draft(session, current)
        mh, limit = self.drafter.markov_head, None
        if self.confidence_stop > 0:
            conf = torch.sigmoid(self.drafter.confidence_head(h, mh.markov_w1(prev)).float())
            limit = torch.cumprod((conf >= self.confidence_stop).long(), dim=1).sum(1)
        if temperature <= 0:
            return Proposal(dl.argmax(-1), None, limit)
        q = torch.softmax(dl / temperature, -1)
        return Proposal(sample(q.flatten(0, 1), gen).view(q.shape[:2]), q, limit)

    def observe(self, tokens: int, seconds: float) -> None:
        pass
