"""Proposers that draft from each row's own token history (no target context): an
n-gram table from the training data, and prompt lookup."""
from __future__ import annotations

import numpy as np

from dflash.decode.proposer import HistoryProposer


class NgramProposer(HistoryProposer):
    name = "ngram"
    """A lookup table from the training data: the most frequent next token after the
    longest matching suffix (up to `order` tokens), chained to fill a block."""

    def __init__(self, sequences, masks=None, order: int = 3, block_size: int = 16):
        from collections import Counter, defaultdict

        self.order, self.block_size = int(order), int(block_size)
        counts = [defaultdict(Counter) for _ in range(self.order + 1)]
        uni = Counter()
        for i, seq in enumerate(sequences):
            seq = [int(t) for t in seq]
            sup = None if masks is None else np.asarray(masks[i], dtype=bool)
            for t in range(1, len(seq)):
                if sup is not None and not sup[t]:
                    continue
                uni[seq[t]] += 1
                for n in range(1, self.order + 1):
                    if t - n < 0:
                        break
                    counts[n][tuple(seq[t - n:t])][seq[t]] += 1
        self.tables = [None] + [{k: c.most_common(1)[0][0] for k, c in counts[n].items()}
                                for n in range(1, self.order + 1)]
        self.fallback = uni.most_common(1)[0][0] if uni else 0

    def next_token(self, history: list) -> int:
        for n in range(min(self.order, len(history)), 0, -1):
            tok = self.tables[n].get(tuple(history[-n:]))
            if tok is not None:
                return tok
        return self.fallback

    def draft(self, history: list) -> list:
        """The block's drafts after `history` (its last token is the anchor)."""
        hist, out = list(history), []
        for _ in range(self.block_size - 1):
            out.append(self.next_token(hist))
            hist.append(out[-1])
        return out


class PromptLookupProposer(HistoryProposer):
    name = "lookup"
    """Drafts the tokens that followed the most recent earlier occurrence of the row's
    last `order`..1 tokens (prompt lookup decoding); the current token repeated when
    nothing matches."""

    def __init__(self, block_size: int = 4, order: int = 3):
        self.block_size, self.order = int(block_size), int(order)

    def draft(self, hist: list) -> list:
        """The block's drafts after `hist` (its last token is the anchor)."""
        want = self.block_size - 1
        for n in range(min(self.order, len(hist) - 1), 0, -1):
            tail = hist[-n:]
            for start in range(len(hist) - n - 1, -1, -1):
                if hist[start:start + n] == tail:
                    out = hist[start + n:start + n + want]
                    if out:
                        return out + [out[-1]] * (want - len(out))
        return [hist[-1]] * want
