"""A frequency-ranked draft vocabulary for the training loss (`loss.draft_vocab=N`).

With a real vocabulary (49K-152K rows) the LM-head softmax is most of a drafter step on
a small device, and a fresh drafter spends its first hundreds of steps learning which
of those rows ever occur. FR-Spec (arXiv 2502.14856) restricts a drafter's LM head to
the most frequent tokens; EAGLE-3 trains over a reduced draft vocabulary. Here only the
*training* softmax is restricted: the CE runs over the N token ids supervised most often
in the training samples (ties: lower id first; never-supervised ids fill the rest, so
N >= the vocabulary is the full softmax, in another row order). A target outside the
set carries no loss and counts as a miss in the step's accuracy. The drafter itself is
unchanged: it still drafts through the target's whole LM head in eval, regenerate and
every engine that reads its checkpoint, so what acceptance shows is what serving gets.
"""
from __future__ import annotations

import numpy as np
import torch

from dflash.errors import ConfigError


class DraftVocab:
    def __init__(self, ids: np.ndarray, vocab_size: int, coverage: float):
        self.ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))  # [N] full-vocabulary ids
        self.index = torch.full((int(vocab_size),), -1, dtype=torch.int64)  # full -> draft
        self.index[self.ids] = torch.arange(len(self.ids), dtype=torch.int64)
        self.coverage = float(coverage)  # share of supervised tokens inside the set
        self._head = None  # (source weight, its draft rows): gathered once

    @classmethod
    def most_frequent(cls, counts: np.ndarray, size: int) -> "DraftVocab":
        """The `size` ids of highest count (int64 counts [vocab]); ties by lower id."""
        if int(size) <= 0:
            raise ConfigError(f"loss.draft_vocab={size}: give a token count (0 in the config: "
                              "the whole vocabulary)")
        counts = np.asarray(counts, dtype=np.int64)
        n = min(int(size), len(counts))
        order = np.lexsort((np.arange(len(counts)), -counts))[:n]  # count desc, id asc
        total = int(counts.sum())
        coverage = float(counts[order].sum()) / total if total else 1.0
        return cls(np.sort(order), len(counts), coverage)

    def __len__(self) -> int:
        return len(self.ids)

    def to(self, device) -> "DraftVocab":
        self.ids, self.index = self.ids.to(device), self.index.to(device)
        return self

    def head(self, weight: torch.Tensor) -> torch.Tensor:
        """The LM head's draft rows [N, H] (the head is frozen: gathered once)."""
        if self._head is None or self._head[0] is not weight:
            self._head = (weight, weight.detach()[self.ids.to(weight.device)].contiguous())
        return self._head[1]

    def targets(self, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(draft-row targets, inside the set) for full-vocabulary `targets`."""
        row = self.index[targets]
        inside = row >= 0
        return torch.where(inside, row, torch.zeros_like(row)), inside

    def full_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """Draft rows (an argmax) back to full-vocabulary ids."""
        return self.ids[rows]
