"""Which public readers read which drafter layout as dflash trained it: each layout's export
through the z-lab reference reader and SpecForge 0.2.0's, block outputs against dflash's
forward. The serving guide's matrix (docs/serving.md) is this test's."""
import json

import pytest
import torch

from dflash.model.checkpoint import save_drafter
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from tests.helpers.reference import reference_drafter, same_blocks, specforge_drafter

LAYOUTS = {  # as drafter_layout's presets write them: (layer_types, window, causal)
    "full": ([], None, False),
    "full_causal": ([], None, True),
    "sliding": (["sliding_attention", "full_attention"], 6, True),
    "sliding_bidirectional": (["sliding_attention", "full_attention"], 6, False),
}
# what each reader does with the layout: True reads it as trained
READS = {"z-lab dflash 0.1.0": {k: True for k in LAYOUTS},
         # SpecForge's DFlash attention always runs bidirectional (is_causal=False), and
         # under sdpa / eager attention its sliding layers see every position (the
         # window reaches only flash attention's kernel): here the window (6) is shorter
         # than the context and block, so it bites
         "SpecForge 0.2.0": {"full": True, "full_causal": False, "sliding": False,
                             "sliding_bidirectional": False}}
LOADERS = {"z-lab dflash 0.1.0": reference_drafter, "SpecForge 0.2.0": specforge_drafter}


def _export(tmp_path, layout):
    kinds, window, causal = LAYOUTS[layout]
    spec = DrafterSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                       intermediate_size=96, vocab_size=300, num_target_layers=6,
                       target_layer_ids=[1, 3], block_size=8, mask_token_id=299,
                       layer_types=kinds, sliding_window=window, causal=causal)
    torch.manual_seed(0)
    ours = DFlashDrafter(spec).eval()
    for p in ours.parameters():  # norms off 1, so a misplaced norm would show
        torch.nn.init.normal_(p, 1.0 if p.dim() == 1 else 0.0, 0.3 if p.dim() == 1 else 0.08)
    return ours, save_drafter(ours, tmp_path / layout, dtype=torch.float32)


@pytest.mark.parametrize("reader", sorted(READS))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_reader_reads_a_layout_as_trained_or_the_matrix_says_it_does_not(tmp_path, reader,
                                                                           layout):
    ours, path = _export(tmp_path, layout)
    diff = same_blocks(ours, LOADERS[reader](path))
    if READS[reader][layout]:
        assert diff < 1e-5, (reader, layout, diff)
    else:  # misread: the outputs really differ (the matrix is not a guess)
        assert diff > 1e-2, (reader, layout, diff)


def test_an_export_a_reader_misreads_says_so(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="dflash.export"):
        _export(tmp_path, "sliding")
    said = [r.getMessage() for r in caplog.records if r.name == "dflash.export"]
    assert len(said) == 1 and "SpecForge 0.2.0" in said[0] and "causal" in said[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="dflash.export"):
        _, path = _export(tmp_path, "full")
    assert not [r for r in caplog.records if r.name == "dflash.export"]  # read as trained
    assert json.loads((path / "config.json").read_text())["is_causal"] is False
