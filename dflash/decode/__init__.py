"""Speculative decoding, once for every caller (evaluation, regeneration, serving checks).

    proposer.py     the Proposer protocol; token proposers; the Proposal a step
    drafter.py      the DFlash / DSpark drafter as a proposer
    history.py      n-gram table and prompt lookup (drafts from a row's own history)
    adaptive.py     plain or lookup, whichever measures faster
    session.py      the target over a batch of prompts with one KV cache
    steps.py        the verify step's rule: anchor + accepted drafts, next anchor after
    speculative.py  the decoding loop and its acceptance record
    backend.py      the Backend protocol and its sampling record
    local.py        a local target: speculative decoding, or HF generate when sampling
    openai.py       an OpenAI-compatible server (vLLM, SGLang, llama.cpp)
"""
from dflash.decode.adaptive import AdaptiveProposer
from dflash.decode.drafter import DrafterProposer
from dflash.decode.history import NgramProposer, PromptLookupProposer
from dflash.decode.proposer import HistoryProposer, PlainProposer, Proposal, Proposer, TokenProposer
from dflash.decode.session import TargetSession
from dflash.decode.speculative import EvalResult, evaluate, speculative_decode

__all__ = ["AdaptiveProposer", "DrafterProposer", "EvalResult", "HistoryProposer",
           "NgramProposer", "PlainProposer", "PromptLookupProposer", "Proposal", "Proposer",
           "TargetSession", "TokenProposer", "evaluate", "speculative_decode"]
