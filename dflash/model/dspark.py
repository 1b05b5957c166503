"""DSpark's heads on the DFlash backbone (DeepSeek's DeepSpec): a Markov head and a
confidence head, and the block layout that says which slot drafts which token.

Markov head ("vanilla", rank r): `W1 = Embedding(V, r)` of the token before a slot's
prediction, `W2 = Linear(r, V_draft)`; `W2 W1[prev]` is added to the backbone's logits
at every drafting slot, a rank-r first-order transition the parallel backbone cannot
express. Training conditions on the data token (teacher forcing); drafting on the
anchor, then on the token chosen at the previous slot (its argmax, whatever the
sampler: llama.cpp's in-graph chain does the same).

Confidence head: `sigmoid(Linear(H + r, 1)([h ; W1[prev]]))`, the chance the slot is
accepted given the earlier ones were; drafting may stop at the first slot below a
threshold (llama.cpp `--spec-draft-p-min`).

Layout (`sample_from_anchor`): false (DFlash's z-lab layout, the default) - slot 0 holds
the anchor and drafts nothing, slot k drafts the token at anchor + k (B - 1 drafts);
true (DeepSpec's anchor-first layout) - slot k drafts the token at anchor + k + 1
(B drafts). Either way the token a slot drafts follows `prev`, the token one before it.
"""
from __future__ import annotations

import torch
from torch import nn

from dflash.errors import ConfigError


class MarkovHead(nn.Module):
    """`markov_w1` [V, r], `markov_w2` [V_draft, r] (the public tensor names). `ids`: the
    full-vocabulary ids of W2's rows (None: W2 spans the vocabulary)."""

    def __init__(self, vocab_size: int, rank: int, rows: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, rows, bias=False)
        # W2 starts at zero: a fresh DSpark drafts as its backbone does, and the
        # transition grows from the data (W1's gradient flows once W2 moves)
        nn.init.zeros_(self.markov_w2.weight)
        self.register_buffer("ids", None, persistent=False)

    def forward(self, prev: torch.Tensor) -> torch.Tensor:
        """[..., V_draft] bias over W2's rows for previous tokens `prev` [...]."""
        return self.markov_w2(self.markov_w1(prev))

    def full(self, prev: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """[..., V] bias for previous tokens `prev`, W2's rows scattered to the vocabulary
        (0 on the ids W2 does not hold)."""
        bias = self(prev)
        if self.ids is None:
            return bias
        out = bias.new_zeros((*bias.shape[:-1], vocab_size))
        out[..., self.ids] = bias
        return out


class ConfidenceHead(nn.Module):
    """`proj` [1, H + r]: one logit per slot from [post-norm hidden ; W1[prev]]."""

    def __init__(self, hidden_size: int, rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size + rank, 1)

    def forward(self, h: torch.Tensor, w1_prev: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([h, w1_prev.to(h.dtype)], dim=-1)).squeeze(-1)


def check_heads(markov_rank: int, confidence: bool, prefix: str = "model.drafter.") -> None:
    if int(markov_rank) < 0:
        raise ConfigError(f"{prefix}markov_rank={markov_rank}: a rank is 0 (plain DFlash) or "
                          "positive (DeepSpec uses 256)")
    if confidence and int(markov_rank) == 0:
        raise ConfigError(f"{prefix}confidence_head needs {prefix}markov_rank > 0: the head "
                          "reads W1[prev] beside the hidden state (llama.cpp loads it only "
                          "with a Markov head)")


def first_slot(spec) -> int:
    """The block slot that drafts first: 0 anchor-first, else 1."""
    return 0 if getattr(spec, "sample_from_anchor", False) else 1  # (any spec-like object)


def num_drafts(spec) -> int:
    """Drafts a block proposes: B anchor-first, else B - 1."""
    return spec.block_size - first_slot(spec)


def previous_tokens(anchor_tok: torch.Tensor, following: torch.Tensor) -> torch.Tensor:
    """[..., n] the token before each drafting slot's: the anchor, then the tokens the
    earlier slots draft (`following` [..., n], the data under teacher forcing)."""
    return torch.cat([anchor_tok[..., None], following[..., :-1]], dim=-1)


def markov_chain(base: torch.Tensor, anchor_tok: torch.Tensor, head: MarkovHead,
                 vocab_size: int):
    """Greedy chaining as drafting does: slot j's logits are `base[..., j, :]` plus the
    bias of prev_j (the anchor, then slot j-1's argmax). base [B, n, V] -> (biased
    logits [B, n, V], prev [B, n])."""
    prev, cols, prevs = anchor_tok, [], []
    for j in range(base.shape[1]):
        col = base[:, j] + head.full(prev, vocab_size).to(base.dtype)
        cols.append(col)
        prevs.append(prev)
        prev = col.argmax(-1)
    return torch.stack(cols, 1), torch.stack(prevs, 1)


def check_heads_objective(spec, loss_kind: str) -> None:
    """DSpark's heads train under loss=dspark only (the fused CE / KL kernels take no
    Markov bias and no confidence target)."""
    if (spec.markov_rank or spec.confidence_head) and loss_kind != "dspark":
        raise ConfigError(f"model.drafter.markov_rank={spec.markov_rank} trains with loss=dspark "
                          f"(got loss={loss_kind}): the other objectives' fused kernels take no "
                          "Markov bias or confidence target")
