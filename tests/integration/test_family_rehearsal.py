"""Every target family users bring (Qwen3, Qwen2.5, Llama 3.1, Mistral, Gemma 3, Phi-3,
Qwen3-MoE), tiny, with its published chat template, through the whole path: regenerate
-> prepare -> training on 2 gloo ranks with the target split over both (target_tp=2) ->
eval (lossless) -> the export read by the public reference reader. docs/tested-models.md
is this test's table (benchmarks/tested_models.py writes it)."""
import json

import pytest
import torch.multiprocessing as mp

from tests.helpers.paths import REPO
from tests.helpers.rehearsal import (DRAFT_VOCAB, FAMILIES, NO_SYSTEM, check_family, prepare_family,
                                     prompts, table, train_rank)


@pytest.mark.slow
def test_every_family_trains_decodes_and_exports_end_to_end(tmp_path):
    from tests.integration.test_distributed_plans import _free_port
    import torch
    names = sorted(FAMILIES)
    prepared = {n: prepare_family(n, tmp_path) for n in names}
    mp.spawn(train_rank, args=(2, _free_port(), str(tmp_path), names, str(tmp_path / "r.pt")),
             nprocs=2)
    trained = torch.load(tmp_path / "r.pt")
    rows = []
    for n in names:
        r = {**prepared[n], **check_family(n, tmp_path, trained)}
        assert r["replies"] == 12 and r["supervised"] > 12, r  # every reply's turn learned
        assert r["target"] == "TensorParallelTarget" and r["steps"] == 6, r
        assert r["final_loss"] < r["initial_loss"], r
        assert r["taps"] == [1, 2, 3, 4, 5], r  # 1..L-3 of 8 layers
        assert r["lossless"] and r["acceptance"] >= 1, r
        assert r["reader_diff"] < 1e-5, r
        assert r["draft_head_rows"] == DRAFT_VOCAB, r  # drafter_draft_vocab/ beside drafter/
        rows.append(r)
    page = (REPO / "docs" / "tested-models.md").read_text()
    assert table(rows) in page, "docs/tested-models.md is stale: python benchmarks/tested_models.py"


def test_a_system_turn_the_template_refuses_is_one_line_naming_the_sample(tmp_path):
    from dflash.data.prepare import prepare
    from dflash.errors import DataError
    from tests.helpers.families import build_tokenizer
    name = sorted(NO_SYSTEM)[0]
    build_tokenizer(name, tmp_path / "tok")
    rows = [{"id": 7, "messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Hi"},
                                   {"role": "assistant", "content": "Hello."}]}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"c.jsonl:1.*System role not supported"):
        prepare(tmp_path / "c.jsonl", tmp_path / "tok", tmp_path / "data")


def test_the_recipe_probe_measures_the_apps_rates_on_a_real_family(tmp_path):
    """The real-model recipe's estimate stage on a family target: the recipe's own apps
    on a few prompts give positive rates, and an estimate that prices them."""
    from dflash.recipe.estimate import Estimate, probe
    from tests.helpers.families import build_target
    from tests.helpers.run import run_module
    model = build_target("qwen3", tmp_path / "m")
    rates = probe(tmp_path / "probe", prompts("qwen3", 4), lambda m, a: run_module(m, *map(str, a)),
                  ["model=hf", f"model.target.path={model}"], [], ["warmup=none"], 8, steps=2)
    assert all(v > 0 for v in rates.values()) and rates["reply_tokens"] <= 8, rates
    est = Estimate(**rates, prompts=100, paths=0, epochs=2)
    assert est.train_seconds == pytest.approx(200 * rates["sample_tokens"] / rates["train_tokens_per_second"])
