"""Kernels: the fused LM-head cross-entropy (Triton) beside its torch reference, and the
fused LM-head KL to the target (distillation)."""
from dflash.kernels.lm_head_kl import fused_lm_head_kl_rows
from dflash.kernels.lm_head_loss import fused_lm_head_ce, fused_lm_head_ce_rows, naive_lm_head_ce

__all__ = ["fused_lm_head_ce", "fused_lm_head_ce_rows", "fused_lm_head_kl_rows",
           "naive_lm_head_ce"]
