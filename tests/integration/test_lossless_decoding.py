
import pytest
import torch
from omegaconf import OmegaConf

from dflash.config import TargetConfig
from tests.helpers.decoding import speculative_generate, target_greedy
from dflash.model.target import Target
from tests.helpers.models import tiny_drafter as _drafter


@pytest.fixture(scope="module")
def target():
    return Target.from_config(OmegaConf.structured(TargetConfig))




def test_speculative_decoding_is_lossless(target):
    untrained = _drafter(target).eval()
    # a drafter that proposes the target's greedy tokens well is emulated by training a
    # little on the target's own greedy output
    from tests.helpers.quick_train import greedy_continuations, train_drafter
    prompts = torch.randint(3, 500, (24, 8), generator=torch.Generator().manual_seed(3))
    seqs = greedy_continuations(target, prompts, 40)
    mask = torch.zeros_like(seqs, dtype=torch.bool)
    mask[:, 8:] = True
    trained = _drafter(target, seed=1)
    train_drafter(trained, target, seqs, mask, steps=60, batch=8, lr=5e-3)
    for drafter in (untrained, trained):
        for p in prompts[:3]:
            res = speculative_generate(target, drafter, p, 30)
            assert res.tokens == target_greedy(target, p, 30)
            assert all(1 <= n <= 16 for n in res.accept_lengths)
    trained_len = speculative_generate(target, trained, prompts[0], 30).acceptance_length
    assert trained_len > speculative_generate(target, untrained, prompts[0], 30).acceptance_length


def test_a_sliding_causal_drafter_decodes_losslessly_in_batches(target):
    """The layouts the public drafters use ([sliding, full], causal blocks) through the
    batched decoder eval and regenerate run: the target's greedy tokens, and the
    trained layout accepts more than an untrained one."""
    from dflash.config import DrafterConfig
    from dflash.eval.decode import evaluate
    from dflash.model.drafter import DFlashDrafter, DrafterSpec
    from tests.helpers.quick_train import greedy_continuations, train_drafter
    cfg = OmegaConf.structured(DrafterConfig(num_layers=2, layer_types=[
        "sliding_attention", "full_attention"], sliding_window=12, causal=True))
    torch.manual_seed(1)
    drafter = DFlashDrafter(DrafterSpec.from_target(target, cfg))
    assert drafter.spec.windows() == [12, None] and drafter.spec.causal
    prompts = torch.randint(3, 500, (24, 8), generator=torch.Generator().manual_seed(3))
    seqs = greedy_continuations(target, prompts, 40)
    mask = torch.zeros_like(seqs, dtype=torch.bool)
    mask[:, 8:] = True
    before = evaluate(target, drafter.eval(), list(prompts[:4]), 30, batch_size=4)
    train_drafter(drafter, target, seqs, mask, steps=60, batch=8, lr=5e-3)
    after = evaluate(target, drafter.eval(), list(prompts[:4]), 30, batch_size=4)
    for i, p in enumerate(prompts[:4]):
        assert after.tokens[i] == before.tokens[i] == target_greedy(target, p, 30)
    assert np_mean(after.accept_lengths) > np_mean(before.accept_lengths)


def np_mean(rows):
    flat = [n for r in rows for n in r]
    return sum(flat) / len(flat)


@pytest.mark.parametrize("family", ["Gemma3TextConfig", "MistralConfig"])
def test_a_sliding_window_target_decodes_losslessly_in_batches(family):
    """A target whose own layers attend over a window (Gemma 3: per-layer types; Mistral:
    every layer) counts the window in positions: padding and rejected drafts in its
    cache must not shorten it. Prompts of different lengths, a window shorter than the
    reply and an untrained drafter (most drafts rejected): HF's greedy tokens, row by row."""
    import transformers
    from dflash.eval.decode import evaluate
    hc = getattr(transformers, family)(
        vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=6,
        pad_token_id=0)
    torch.manual_seed(0)
    tgt = Target(transformers.AutoModelForCausalLM.from_config(hc)).eval()
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 500, (n,), generator=g) for n in (5, 11, 8)]
    res = evaluate(tgt, _drafter(tgt).eval(), prompts, 20, batch_size=3)
    for i, p in enumerate(prompts):
        assert res.tokens[i] == target_greedy(tgt, p, 20), i
