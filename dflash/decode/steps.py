"""The verify step's rule, once: a step emits its anchor and the anchor's accepted drafts
(clamped to the tokens left), and the next step is anchored at the token after them.

The decoder applies it live (`emit`), the teacher-forced estimate and the walk along a
greedy reply apply it to known streaks (`walk`, and `emit` on tensors for rows walking in
lockstep).
"""
from __future__ import annotations

import torch


def emit(accepted, left):
    """Tokens a verify step emits: its anchor and `accepted` drafts, at most `left`
    (ints, or tensors of them row by row)."""
    if isinstance(accepted, torch.Tensor):
        return torch.minimum(1 + accepted, left)
    return min(1 + int(accepted), int(left))


def walk(length: int, accepted_at) -> list:
    """Tokens emitted per verify step along a continuation of `length` tokens, the anchor
    at index a accepting `accepted_at(a)` drafts."""
    steps, a = [], 0
    while a < length:
        steps.append(emit(accepted_at(a), length - a))
        a += steps[-1]
    return steps
