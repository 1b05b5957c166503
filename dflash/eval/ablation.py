"""Does the drafter use its target context? Three acceptance lengths side by side.

    trained        the trained drafter, as served
    zero context   the same drafter with the target context multiplied by zero
    n-gram         a lookup table of the training data's supervised transitions

A drafter that only memorised local token statistics scores like the n-gram table and
loses nothing when its context is zeroed; one that reads the target's hidden states
beats both.
"""
from __future__ import annotations

from dflash.decode import DrafterProposer, NgramProposer, speculative_decode


def context_ablation(trainer, max_new_tokens: int | None = None, order: int = 3) -> dict:
    ds, n = trainer.dataset, len(trainer.sources.data.lengths)
    rows = [ds.sample(i) for i in range(n)]
    ngram = NgramProposer([t for t, _ in rows], [m for _, m in rows], order=order,
                          block_size=trainer.drafter.spec.block_size)
    new = int(max_new_tokens or trainer.cfg.eval.max_new_tokens)
    prompts = trainer.sources.eval_prompts
    trainer.drafter.eval()
    out = {}
    for name, prop in (("trained", DrafterProposer(trainer.drafter, trainer.target)),
                       ("zero_context", DrafterProposer(trainer.drafter, trainer.target, True)),
                       (f"ngram{order}", ngram)):
        out[name] = speculative_decode(trainer.target, prop, prompts, new).acceptance_length
    return out
