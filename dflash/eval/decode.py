"""Evaluation's name for the decoder: the speculative decoding wing (`dflash.decode`)
as evaluation and its tests import it."""
from dflash.decode import DrafterProposer, EvalResult, TargetSession, evaluate, speculative_decode

__all__ = ["DrafterProposer", "EvalResult", "TargetSession", "evaluate", "speculative_decode"]
