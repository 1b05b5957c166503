"""A drafter checkpoint means to every reader what it meant to dflash: every config field
round-trips, the transformers 5 rope spelling and attention bias are honoured, and what
dflash cannot run faithfully (sliding windows, scaled rope) is refused, not misread."""
import dataclasses
import json

import pytest
import torch
from omegaconf import OmegaConf

from dflash.config import TargetConfig
from dflash.errors import ConfigError, DataError
from dflash.model.checkpoint import load_drafter, save_drafter
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.target import Target

# every field differs from its default, so a field dropped on save or load shows
SPEC = DrafterSpec(hidden_size=48, num_layers=2, num_heads=6, num_kv_heads=3, head_dim=16,
                   intermediate_size=80, vocab_size=300, num_target_layers=7,
                   target_layer_ids=[1, 3, 5], block_size=8, mask_token_id=297,
                   rms_norm_eps=1e-5, rope_theta=5e6, max_position_embeddings=12345,
                   attention_bias=True)


def _saved(tmp_path, spec=SPEC, edit=None):
    torch.manual_seed(0)
    d = DFlashDrafter(spec)
    path = save_drafter(d, tmp_path / "ckpt")
    if edit:
        cfg = json.loads((path / "config.json").read_text())
        edit(cfg)
        (path / "config.json").write_text(json.dumps(cfg))
    return d, path


def _outputs(d, seed=1):
    g = torch.Generator().manual_seed(seed)
    s = d.spec
    ctx = torch.randn(2, 20, len(s.target_layer_ids) * s.hidden_size, generator=g)
    valid = torch.ones(2, 20, dtype=torch.bool)
    anchors = torch.tensor([[4, 12], [7, 15]])
    ok = torch.ones(2, 2, dtype=torch.bool)
    emb = torch.randn(2, 2 * s.block_size, s.hidden_size, generator=g)
    return d.eval()(ctx, valid, anchors, ok, emb)


def test_every_field_round_trips_and_readers_see_the_same_model(tmp_path):
    d, path = _saved(tmp_path)
    back = load_drafter(path)
    assert dataclasses.asdict(back.spec) == dataclasses.asdict(SPEC)
    for k, v in d.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v, rtol=0, atol=0)
    torch.testing.assert_close(_outputs(back), _outputs(d), rtol=0, atol=0)
    assert back.layers[0].self_attn.q_proj.bias is not None
    # what a transformers reader of the config sees
    from transformers import Qwen3Config
    hc = Qwen3Config.from_dict(json.loads((path / "config.json").read_text()))
    assert hc.rope_parameters["rope_theta"] == 5e6 and hc.attention_bias is True
    assert hc.layer_types == ["full_attention"] * 2 and not hc.use_sliding_window
    assert (hc.hidden_size, hc.num_hidden_layers, hc.head_dim, hc.rms_norm_eps,
            hc.max_position_embeddings) == (48, 2, 16, 1e-5, 12345)


def test_rope_parameters_alone_set_theta(tmp_path):
    def transformers5(cfg):
        del cfg["rope_theta"]
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e6}
    d, path = _saved(tmp_path, edit=transformers5)
    back = load_drafter(path)
    assert back.spec.rope_theta == 5e6
    torch.testing.assert_close(_outputs(back), _outputs(d), rtol=0, atol=0)


@pytest.mark.parametrize("edit, message", [
    (lambda c: (c.update(layer_types=["sliding_attention", "full_attention"], sliding_window=64),
                c.pop("is_causal"), c["dflash_config"].pop("causal")),
     r"is_causal is not set and the layers mix sliding"),
    (lambda c: c.update(layer_types=["full_attention", "local"], sliding_window=64),
     r"layer_types: unknown layer type 'local'"),
    (lambda c: c.update(layer_types=["full_attention"]), r"layer_types has 1 entries for 2 layers"),
    (lambda c: c.update(layer_types=["sliding_attention"] * 2, sliding_window=0),
     r"sliding_window=0: a window must be a positive"),
    (lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
     r"rope_type 'yarn' is not supported"),
])
def test_configs_dflash_cannot_run_faithfully_are_refused(tmp_path, edit, message):
    _, path = _saved(tmp_path, edit=edit)
    with pytest.raises(DataError, match=message):
        load_drafter(path)


def test_every_tappable_layer_matches_output_hidden_states():
    t = Target.from_config(OmegaConf.structured(TargetConfig()))
    n = len(t.base.layers)
    t = Target(t.lm, list(range(n - 1)))  # every layer a drafter may be served
    ids = torch.randint(3, 500, (2, 11))
    ref = t.lm(ids, output_hidden_states=True).hidden_states
    ctx = t.context(ids).split(t.hidden_size, dim=-1)
    for i in range(n - 1):
        torch.testing.assert_close(ctx[i], ref[i + 1], msg=f"layer {i}")
    _, full = t.logits_and_context(ids)
    torch.testing.assert_close(full, torch.cat(ctx, dim=-1))


def test_the_last_layer_is_refused_as_a_tap_naming_the_key():
    t = Target.from_config(OmegaConf.structured(TargetConfig()))
    n = len(t.base.layers)
    with pytest.raises(ConfigError, match=rf"model.target.layer_ids=.*taps layer {n - 1}.*final norm"):
        Target(t.lm, [1, n - 1])


def test_a_checkpoint_tapping_the_last_layer_is_refused(tmp_path):
    _, path = _saved(tmp_path, edit=lambda c: c["dflash_config"].update(target_layer_ids=[1, 3, 6]))
    with pytest.raises(DataError, match=r"target_layer_ids.*last"):
        load_drafter(path)


@pytest.mark.parametrize("edit, layout", [
    (lambda c: (c.update(is_causal=True), c["dflash_config"].pop("causal")),
     ([], None, True)),
    (lambda c: c.update(is_causal=True), ([], None, False)),  # dflash_config first
    (lambda c: (c.pop("layer_types"), c.pop("is_causal"), c["dflash_config"].pop("causal"),
                c.update(use_sliding_window=True, sliding_window=64, max_window_layers=0)),
     (["sliding_attention"] * 2, 64, True)),  # the reference reader's default: causal
])
def test_causality_and_layout_are_read_as_the_reference_reader_reads_them(tmp_path, edit, layout):
    _, path = _saved(tmp_path, edit=edit)
    s = load_drafter(path).spec
    assert (s.layer_types, s.sliding_window, s.causal) == layout


def test_bf16_export_is_half_the_size_says_so_and_loads(tmp_path):
    torch.manual_seed(0)
    d = DFlashDrafter(SPEC)
    full = save_drafter(d, tmp_path / "fp32", dtype=torch.float32)
    half = save_drafter(d, tmp_path / "bf16", dtype=torch.bfloat16)
    cfg = json.loads((half / "config.json").read_text())
    assert cfg["dtype"] == cfg["torch_dtype"] == "bfloat16"
    assert json.loads((full / "config.json").read_text())["dtype"] == "float32"
    ratio = (half / "model.safetensors").stat().st_size / (full / "model.safetensors").stat().st_size
    assert 0.49 < ratio < 0.52
    back = load_drafter(half)
    for k, v in d.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k].float(), v.to(torch.bfloat16).float())


def test_export_dtype_auto_is_bf16_on_cuda_only():
    from dflash.model.checkpoint import export_dtype
    assert export_dtype("auto", "cuda:0") is torch.bfloat16
    assert export_dtype("auto", "cpu") is torch.float32
    assert export_dtype("bfloat16", "cpu") is torch.bfloat16


def test_one_dtype_has_one_meaning_under_either_spelling():
    """model.autocast=bf16 and checkpoint.dtype=bfloat16 were the only spellings each
    took; both keys now take both."""
    from dflash.config import compose
    from dflash.model.checkpoint import export_dtype
    assert export_dtype("bf16", "cpu") is export_dtype("bfloat16", "cpu") is torch.bfloat16
    assert export_dtype("fp32", "cpu") is torch.float32
    cfg = compose("train", ["checkpoint.dtype=bf16", "model.autocast=bfloat16"])
    assert (str(cfg.checkpoint.dtype), str(cfg.model.autocast)) == ("bf16", "bfloat16")


def test_an_incompatible_warm_start_names_the_field():
    from dflash.model.checkpoint import check_compatible
    check_compatible(SPEC, dataclasses.replace(SPEC), "init")
    for field, value in [("block_size", 16), ("target_layer_ids", [1, 2, 5]),
                         ("mask_token_id", 299), ("vocab_size", 400), ("num_layers", 3),
                         ("causal", True)]:
        with pytest.raises(DataError, match=rf"init: {field} is .* in this run"):
            check_compatible(SPEC, dataclasses.replace(SPEC, **{field: value}), "init")
