"""What a training run reads: the data set, the frozen target and held-out prompts."""
from dflash.sources.build import Sources, build_sources, prompt_of, sources_for_ranks

__all__ = ["Sources", "build_sources", "prompt_of", "sources_for_ranks"]
