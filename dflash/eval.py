"""Speculative decoding with greedy verification, and the acceptance length it achieves.

Each step the drafter proposes bs-1 tokens after the current token; one target forward
over [sequence, current token, drafts] gives the target's own greedy choice at every
draft position. Drafts are accepted up to the first disagreement, then the target's
choice there is appended (the bonus token). The output is therefore exactly the target's
greedy decoding (lossless), and acceptance length = accepted drafts + 1 per verify step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .model.loss import block_embeddings


@dataclass
class SpecResult:
    tokens: list  # generated token ids (after the prompt)
    accept_lengths: list = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        return sum(self.accept_lengths) / max(1, len(self.accept_lengths))


@torch.no_grad()
def propose(drafter, target, ctx: torch.Tensor, current: int, position: int) -> torch.Tensor:
    """bs-1 greedy drafts for the block anchored at `position` (holding `current`)."""
    dev = ctx.device
    anchors = torch.tensor([[position]], device=dev)
    ids = torch.tensor([[current]], device=dev)
    emb = block_embeddings(target.embed_tokens, ids, torch.zeros_like(anchors),
                           drafter.spec.block_size, drafter.spec.mask_token_id)
    valid = torch.ones(ctx.shape[:2], dtype=torch.bool, device=dev)
    h = drafter(ctx, valid, anchors, torch.ones_like(anchors, dtype=torch.bool), emb)
    return (h[0, 0, 1:] @ target.lm_head_weight.t()).argmax(-1)


@torch.no_grad()
def speculative_generate(target, drafter, prompt, max_new_tokens: int) -> SpecResult:
    dev = target.lm_head_weight.device
    seq = torch.as_tensor(prompt, dtype=torch.long, device=dev).view(1, -1)
    logits, ctx = target.logits_and_context(seq)
    current = int(logits[0, -1].argmax())
    out = SpecResult([])
    while len(out.tokens) < max_new_tokens:
        a = seq.shape[1]
        draft = propose(drafter, target, ctx, current, a)
        cand = torch.cat([seq, torch.tensor([[current]], device=dev), draft.view(1, -1)], dim=1)
        logits, ctx_all = target.logits_and_context(cand)
        choice = logits[0, a:].argmax(-1)  # choice[i]: target's token after cand[a + i]
        n = 0
        while n < len(draft) and int(draft[n]) == int(choice[n]):
            n += 1
        accepted = [current] + draft[:n].tolist()
        out.tokens += accepted
        out.accept_lengths.append(n + 1)
        seq = cand[:, :a + 1 + n]
        ctx = ctx_all[:, :seq.shape[1]]  # causal: states of committed tokens are final
        current = int(choice[n])
    out.tokens = out.tokens[:max_new_tokens]
    return out


@torch.no_grad()
def target_greedy(target, prompt, max_new_tokens: int) -> list:
    """The target's own greedy decoding, one full forward per token (the reference)."""
    dev = target.lm_head_weight.device
    seq = torch.as_tensor(prompt, dtype=torch.long, device=dev).view(1, -1)
    out = []
    for _ in range(max_new_tokens):
        nxt = int(target.lm(input_ids=seq, use_cache=False).logits[0, -1].argmax())
        out.append(nxt)
        seq = torch.cat([seq, torch.tensor([[nxt]], device=dev)], dim=1)
    return out


def acceptance_length(target, drafter, prompts, max_new_tokens: int = 48) -> float:
    """Mean accepted tokens per verify step (+1 bonus) over all prompts' steps."""
    lengths = []
    was_training = drafter.training
    drafter.eval()
    try:
        for p in prompts:
            lengths += speculative_generate(target, drafter, p, max_new_tokens).accept_lengths
    finally:
        drafter.train(was_training)
    return sum(lengths) / max(1, len(lengths))
