"""The draft-vocabulary export: the drafter's LM head cut to the kept ids (lm_head.weight +
d2t offsets, as EAGLE-3 / speculators and llama.cpp's DSpark converter read them), read
back by dflash, drafting over the kept rows only, and still lossless."""
import json
import re

import pytest
import torch
from safetensors.torch import load_file

from dflash.errors import DataError
from dflash.decode import DrafterProposer, TargetSession
from dflash.model.checkpoint import load_drafter, save_drafter
from dflash.model.draft_head import save_draft_head
from tests.helpers.decoding import speculative_generate, target_greedy
from tests.helpers.models import random_prompts, tiny_drafter, tiny_target

KEPT = [2, 7, 40, 41, 99, 300, 511, 5]  # any order: exported ascending


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dv")
    target = tiny_target().eval()
    drafter = tiny_drafter(target).eval()
    full = save_drafter(drafter, root / "drafter")
    head = save_draft_head(full, root / "drafter_draft_vocab", KEPT, target.lm_head_weight)
    return target, drafter, full, head


def test_the_export_carries_the_kept_rows_and_their_offsets(models):
    target, _, _, head = models
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["architectures"][0] == "DSparkDraftModel" and cfg["draft_vocab_size"] == 8
    assert cfg["sample_from_anchor"] is False
    state = load_file(str(head / "model.safetensors"))
    ids = sorted(KEPT)
    assert state["d2t"].tolist() == [t - i for i, t in enumerate(ids)]
    assert torch.equal(state["lm_head.weight"], target.lm_head_weight[ids])


def test_drafting_reads_only_the_kept_rows_and_stays_lossless(models):
    target, drafter, _, head = models
    reduced = load_drafter(head).eval()
    prompt = random_prompts(1)[0]
    sess = TargetSession(target, [prompt], len(prompt) + 32)
    cur = sess.first_logits.argmax(-1)
    full = DrafterProposer(drafter, target).logits(sess, cur)
    cut = DrafterProposer(reduced, target).logits(sess, cur)
    ids = torch.tensor(sorted(KEPT))
    assert torch.allclose(cut[..., ids], full[..., ids], atol=1e-5)
    others = torch.ones(full.shape[-1], dtype=torch.bool)
    others[ids] = False
    assert torch.isinf(cut[..., others]).all() and set(cut.argmax(-1).flatten().tolist()) <= set(KEPT)
    for p in random_prompts(3):
        assert speculative_generate(target, reduced, p, 20).tokens == target_greedy(target, p, 20)


def test_a_head_whose_tables_disagree_is_refused_naming_the_export(models, tmp_path):
    _, _, full, head = models
    bad = tmp_path / "bad"
    save_draft_head(full, bad, KEPT, models[0].lm_head_weight)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["draft_vocab_size"] = 9
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DataError, match=r"bad: d2t has 8 rows .* for draft_vocab_size 9"):
        load_drafter(bad)
    with pytest.raises(DataError, match="repeats a token id"):
        save_draft_head(full, tmp_path / "dup", [3, 3], models[0].lm_head_weight)


def test_the_app_reads_drafter_data_and_target_config_first_each_refused_in_one_line(
        models, tmp_path, capsys):
    """What the user names is read before the target's weights load; a directory whose
    config.json transformers cannot read (not JSON, no model_type) is one line naming
    the flag, not transformers' traceback."""
    from dflash.data.format import DatasetWriter
    from dflash.model.draft_head import main
    full = models[2]
    data = tmp_path / "data"
    w = DatasetWriter(data, vocab_size=512)
    w.add([1, 2, 3, 4], [0, 1, 1, 1])
    w.close()
    nomt, notjson = tmp_path / "nomt", tmp_path / "notjson"
    for d, text in ((nomt, '{"hidden_size": 4}'), (notjson, "{oops")):
        d.mkdir()
        (d / "config.json").write_text(text)
    for drafter, data_dir, target, named in [
            (tmp_path / "nope", data, nomt, "drafter checkpoint .*nope: no such directory"),
            (full, tmp_path, nomt, "is not a dflash data set"),
            (full, data, nomt, r"--target=.*nomt: its config.json cannot be read .*model_type"),
            (full, data, notjson, r"--target=.*notjson: its config.json cannot be read .*JSON")]:
        with pytest.raises(SystemExit) as e:
            main(["--drafter", str(drafter), "--data", str(data_dir), "--target", str(target),
                  "--size", "4", "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and re.search(named, err[0]), err
