"""The target families users bring, built tiny from their own HF config classes: each
gives the drafter its context (taps 1..L-3 derived from its depth) and one training
step through it runs and moves the loss; a family transformers cannot build is named."""
import pytest
import torch
from omegaconf import OmegaConf

from dflash.config import DrafterConfig
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.loss import Objective
from dflash.model.target import Target
from dflash.step import DeviceBatch, StepPolicy, TrainStep

COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
              num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
              eos_token_id=2)
FAMILIES = {  # config class -> extra keys of the family
    "Qwen2Config": {}, "Qwen3Config": {}, "LlamaConfig": {}, "MistralConfig": {"sliding_window": 16},
    "Gemma3TextConfig": {"head_dim": 16, "sliding_window": 8},  # sliding layers, scaled embeddings
    "Phi3Config": {}, "Olmo2Config": {},
    "Qwen3MoeConfig": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_drives_the_drafter_through_a_training_step(family):
    import transformers
    from transformers import AutoModelForCausalLM
    hc = getattr(transformers, family)(**COMMON, **FAMILIES[family])
    torch.manual_seed(0)
    target = Target(AutoModelForCausalLM.from_config(hc))
    assert target.layer_ids == [1, 2, 3, 4, 5]  # 5 layers from 1 to L-3 of 8
    spec = DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig(num_layers=1)))
    drafter = DFlashDrafter(spec)
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    step = TrainStep(target, drafter, opt, sched, Objective(8), StepPolicy())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (2, 40), generator=g)
    mask = torch.ones(2, 40, dtype=torch.bool)
    batch = DeviceBatch(None, ids, mask, mask)
    ctx = target.context(ids, mask.long())
    assert ctx.shape == (2, 40, 5 * 64) and torch.isfinite(ctx).all()
    losses = [float(step.drafter_step(batch, ctx)["loss"]) for _ in range(6)]
    assert all(map(torch.isfinite, map(torch.tensor, losses))) and losses[-1] < losses[0]
