"""The production drafter derived from a target's own files: Qwen3-8B's gives the published
drafter (model=qwen3_8b's pinned values), larger targets a shallower drafter whose training
state still fits, and what cannot be derived is refused naming the key."""
import json

import pytest
from omegaconf import OmegaConf

from dflash.config import compose
from dflash.errors import DataError
from dflash.model.derive import STATE_BUDGET_GIB, drafter_layers, state_gib
from dflash.model.target import checked_layer_ids
from dflash.preflight.common import checked_mask, vocab_of
from dflash.preflight.target_files import read_config, read_tokenizer
from tests.helpers.model_fixtures import write_model


def derived(path):
    """What experiment=production's model resolves to for the target at `path`."""
    m = compose("train", ["experiment=production", f"model.target.path={path}"]).model
    text = read_config(path).get_text_config()
    taps = checked_layer_ids(m.target.layer_ids, int(text.num_hidden_layers))
    mask = checked_mask(m.drafter, vocab_of(read_config(path)), read_tokenizer(path))
    d = m.drafter
    return {"num_layers": d.num_layers, "block_size": d.block_size,
            "num_anchors": d.num_anchors, "layer_ids": taps, "mask_token_id": mask,
            "dtype": m.target.dtype, "compile": str(m.compile)}


def test_qwen3_8b_derives_the_published_drafter(tmp_path):
    pinned = compose("train", ["model=qwen3_8b", "model.target.path=/x"]).model
    want = {"num_layers": pinned.drafter.num_layers, "block_size": pinned.drafter.block_size,
            "num_anchors": pinned.drafter.num_anchors,
            "layer_ids": list(pinned.target.layer_ids),
            "mask_token_id": pinned.drafter.mask_token_id, "dtype": pinned.target.dtype,
            "compile": str(pinned.compile)}
    assert want["layer_ids"] == [1, 9, 17, 25, 33] and want["mask_token_id"] == 151669
    assert derived(write_model(tmp_path, "Qwen3-8B")) == want


@pytest.mark.parametrize("name, layers, taps, mask", [
    ("Qwen3-32B", 2, [1, 16, 31, 46, 61], 151669),
    ("Llama-3.1-8B", 5, [1, 8, 15, 22, 29], 128255),
    ("Llama-3.1-70B", 1, [1, 20, 39, 58, 77], 128255),
])
def test_a_larger_target_gets_the_deepest_drafter_whose_state_fits(tmp_path, name, layers,
                                                                   taps, mask):
    path = write_model(tmp_path, name)
    d = derived(path)
    assert (d["num_layers"], d["layer_ids"], d["mask_token_id"]) == (layers, taps, mask)
    assert state_gib(path, layers) <= STATE_BUDGET_GIB
    assert layers == 5 or state_gib(path, layers + 1) > STATE_BUDGET_GIB


def test_a_config_without_a_size_is_refused_naming_the_key(tmp_path):
    path = write_model(tmp_path, "Qwen3-8B")
    cfg = json.loads((path / "config.json").read_text())
    del cfg["intermediate_size"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DataError, match="config.json has no intermediate_size.*model.drafter.num_layers"):
        drafter_layers(path)
    with pytest.raises(DataError, match="no config.json there"):
        drafter_layers(tmp_path / "nowhere")
    # an explicit depth needs no derivation
    m = compose("train", ["experiment=production", f"model.target.path={path}",
                          "model.drafter.num_layers=3"]).model
    assert OmegaConf.to_container(m.drafter, resolve=True)["num_layers"] == 3
