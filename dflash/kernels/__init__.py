"""Kernels: the fused LM-head cross-entropy (Triton) beside its torch reference."""
from dflash.kernels.lm_head_loss import fused_lm_head_ce, fused_lm_head_ce_rows, naive_lm_head_ce

__all__ = ["fused_lm_head_ce", "fused_lm_head_ce_rows", "naive_lm_head_ce"]
