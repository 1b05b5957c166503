"""dflash's drafter against the public reference drafter (z-lab dflash 0.1.0): the same
weights and inputs give the same block outputs for full, sliding, causal and mixed
layer layouts, in the training forward (many anchors) and through the exported config."""
import json

import pytest
import torch

from dflash.model.checkpoint import load_drafter, save_drafter
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from tests.helpers.reference import reference_drafter, reference_model

LAYOUTS = {  # (layer_types, sliding_window, causal)
    "full": ([], None, False),
    "causal": ([], None, True),
    "sliding": (["sliding_attention"] * 3, 6, True),
    "mixed": (["sliding_attention", "sliding_attention", "full_attention"], 5, True),
    "sliding-bidirectional": (["sliding_attention", "full_attention", "sliding_attention"], 4, False),
}


def _spec(layout):
    kinds, window, causal = LAYOUTS[layout]
    return DrafterSpec(hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
                       intermediate_size=96, vocab_size=300, num_target_layers=6,
                       target_layer_ids=[1, 3], block_size=8, mask_token_id=299,
                       layer_types=kinds, sliding_window=window, causal=causal)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_block_equals_the_reference_drafter(tmp_path, layout):
    torch.manual_seed(0)
    ours = DFlashDrafter(_spec(layout)).eval()
    for p in ours.parameters():  # norms off 1, so a misplaced norm would show
        torch.nn.init.normal_(p, 1.0 if p.dim() == 1 else 0.0, 0.3 if p.dim() == 1 else 0.08)
    path = save_drafter(ours, tmp_path / "d", dtype=torch.float32)
    ref = reference_drafter(path)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["is_causal"] == cfg["dflash_config"]["causal"] == LAYOUTS[layout][2]
    assert len(cfg["layer_types"]) == 3
    g = torch.Generator().manual_seed(1)
    s, bs, h = 30, 8, 64
    ctx = torch.randn(1, s, 2 * h, generator=g)
    anchors = torch.tensor([[3, 11, 17, 29]])
    emb = torch.randn(1, 4, bs, h, generator=g)
    with torch.no_grad():
        got = ours(ctx, torch.ones(1, s, dtype=torch.bool), anchors,
                   torch.ones_like(anchors, dtype=torch.bool), emb)
        for j, a in enumerate(anchors[0].tolist()):  # the reference drafts one block at a
            want = ref(position_ids=torch.arange(a + bs)[None],  # time after its context
                       noise_embedding=emb[:, j], target_hidden=ctx[:, :a])
            torch.testing.assert_close(got[:, j], want, rtol=1e-5, atol=2e-6)
    # and dflash reads its export back as the same layout
    back = load_drafter(path).spec
    assert (back.layer_types, back.sliding_window, back.causal) == LAYOUTS[layout]


def test_the_layouts_differ_so_the_comparison_can_fail(tmp_path):
    outs = {}
    g = torch.Generator().manual_seed(1)
    ctx, emb = torch.randn(1, 30, 128, generator=g), torch.randn(1, 1, 8, 64, generator=g)
    for layout in ("full", "causal", "sliding"):
        torch.manual_seed(0)
        d = DFlashDrafter(_spec(layout)).eval()
        with torch.no_grad():
            outs[layout] = d(ctx, torch.ones(1, 30, dtype=torch.bool), torch.tensor([[29]]),
                             torch.ones(1, 1, dtype=torch.bool), emb)
    assert not torch.allclose(outs["full"], outs["causal"], atol=1e-4)
    assert not torch.allclose(outs["causal"], outs["sliding"], atol=1e-4)


@pytest.mark.parametrize("override, message", [
    ({"layer_types": ["sliding_attention"], "sliding_window": 0},
     r"model.drafter.sliding_window=0: a window must be a positive"),
    ({"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 8},
     r"model.drafter.layer_types has 2 entries for 1 layers \(model.drafter.num_layers\)"),
    ({"layer_types": ["swa"], "sliding_window": 8},
     r"model.drafter.layer_types: unknown layer type 'swa'"),
    ({"layer_types": ["sliding_attention"]},
     r"sliding_attention layers but model.drafter.sliding_window is not set"),
])
def test_a_layout_the_drafter_cannot_run_is_refused_naming_the_key(override, message):
    from omegaconf import OmegaConf
    from dflash.config import DrafterConfig
    from dflash.errors import ConfigError
    from tests.helpers.models import tiny_target
    cfg = OmegaConf.merge(OmegaConf.structured(DrafterConfig()), override)
    with pytest.raises(ConfigError, match=message):
        DrafterSpec.from_target(tiny_target(), cfg)


def test_a_drafter_saved_by_the_reference_package_loads_as_the_same_model(tmp_path):
    """A published-style sliding drafter ([sliding, sliding, full], window 5, causal),
    written by the reference package itself, is read by dflash (warm start) as the
    model the reference runs."""
    from transformers import Qwen3Config
    ref = reference_model()
    hc = Qwen3Config(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=300,
                     layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                     sliding_window=5, use_sliding_window=True, max_window_layers=2,
                     rope_theta=1e6, tie_word_embeddings=False)
    hc.is_causal = True
    hc.num_target_layers = 6
    hc.dflash_config = {"block_size": 8, "mask_token_id": 299, "target_layer_ids": [1, 3]}
    torch.manual_seed(0)
    published = ref.DFlashDraftModel(hc).float().eval()
    for p in published.parameters():
        torch.nn.init.normal_(p, 1.0 if p.dim() == 1 else 0.0, 0.3 if p.dim() == 1 else 0.08)
    published.save_pretrained(tmp_path / "pub")
    ours = load_drafter(tmp_path / "pub").eval()
    assert (ours.spec.layer_types[0], ours.spec.sliding_window, ours.spec.causal) == (
        "sliding_attention", 5, True)
    g = torch.Generator().manual_seed(2)
    ctx, emb = torch.randn(1, 20, 128, generator=g), torch.randn(1, 1, 8, 64, generator=g)
    with torch.no_grad():
        got = ours(ctx, torch.ones(1, 20, dtype=torch.bool), torch.tensor([[20]]),
                   torch.ones(1, 1, dtype=torch.bool), emb)
        want = published(position_ids=torch.arange(28)[None], noise_embedding=emb[:, 0],
                         target_hidden=ctx)
    torch.testing.assert_close(got[:, 0], want, rtol=1e-5, atol=2e-6)
