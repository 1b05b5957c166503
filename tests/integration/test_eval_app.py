"""Speculative decoding: batched, KV-cached, lossless, and the rejection rule."""
import pytest
import torch
from omegaconf import OmegaConf

from dflash.config import DrafterConfig, TargetConfig
from dflash.decode import DrafterProposer, speculative_decode
from tests.helpers.decoding import target_greedy
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.target import Target
from tests.helpers.models import random_prompts as _prompts


@pytest.fixture(scope="module")
def target():
    return Target.from_config(OmegaConf.structured(TargetConfig()))




def test_batched_decoding_equals_target_greedy_and_feeds_only_new_tokens(target):
    torch.manual_seed(0)
    drafter = DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig()))).eval()
    prompts = _prompts()
    widths = []
    # token rows the target embeds (the drafter's [B, A, bs] block lookups are 3-D)
    hook = target.embed_tokens.register_forward_hook(
        lambda _m, i, _o: widths.append(i[0].shape) if i[0].dim() == 2 else None)
    try:
        res = speculative_decode(target, DrafterProposer(drafter, target), prompts, 20,
                                 batch_size=3)
    finally:
        hook.remove()
    for p, toks, acc in zip(prompts, res.tokens, res.accept_lengths):
        assert toks == target_greedy(target, p, 20)
        assert sum(acc) == 20 and all(1 <= a <= 16 for a in acc)
    # a prefill per batch, then every verify forward holds exactly [current + 15 drafts]
    verify = [w for w in widths if w[1] == 16]
    assert len(widths) - len(verify) == 2 and verify
    fed = sum(w[0] * w[1] for w in widths)
    assert fed < sum(len(p) + 20 for p in prompts) * 16  # no prefix is ever re-run
    assert sum(res.histogram) == sum(len(a) for a in res.accept_lengths)


def test_eval_app_measures_a_checkpoint_and_refuses_a_mismatch(tmp_path, target):
    import json

    from tests.helpers.run import run_module
    from dflash.model.checkpoint import save_drafter

    target.lm.save_pretrained(tmp_path / "target")
    torch.manual_seed(0)
    save_drafter(DFlashDrafter(DrafterSpec.from_target(
        target, OmegaConf.structured(DrafterConfig()))), tmp_path / "drafter")
    with open(tmp_path / "prompts.jsonl", "w") as f:
        for p in _prompts(3):
            f.write(json.dumps({"prompt_ids": p}) + "\n")
    # the same prompts with the target's greedy replies: the walk along them (paths=)
    from dflash.data.format import DatasetWriter
    from tests.helpers.decoding import target_greedy
    w = DatasetWriter(tmp_path / "paths", vocab_size=target.vocab_size)
    for p in _prompts(3):
        w.add(p + target_greedy(target, p, 10), [0] * len(p) + [1] * 10)
    w.close()
    args = [f"drafter={tmp_path}/drafter", f"prompts={tmp_path}/prompts.jsonl",
            f"model.target.path={tmp_path}/target", "max_new_tokens=10",
            f"out={tmp_path}/r.json", f"hydra.run.dir={tmp_path}/run"]
    proc = run_module("dflash.eval", *args, "baselines=[untrained,lookup]",
                      f"paths={tmp_path}/paths")
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report["per_prompt"]) == 3 and report["generated_tokens"] == 30
    assert sum(report["histogram"]) == report["verify_steps"]
    assert "acceptance length" in proc.stdout
    # each baseline on the same prompts, with the drafter's paired difference
    for name in ("untrained", "lookup"):
        b = report["baselines"][name]
        assert len(b["per_prompt"]) == 3 and b["generated_tokens"] == 30
        d = b["drafter_minus_this"]
        assert d["lo"] <= d["difference"] <= d["hi"] and name in proc.stdout
    # walking the greedy replies takes decoding's steps (the tiny target in float32
    # verifies without near ties): the same acceptance for every decoder
    paths = report["paths"]
    assert paths["replies"] == 3 and "along 3 held-out greedy replies" in proc.stdout
    for walked, run in [(paths, report), *[(paths["baselines"][n], report["baselines"][n])
                                          for n in ("untrained", "lookup")]]:
        assert walked["per_prompt_steps"] == run["per_prompt_steps"]
        assert walked["acceptance_length"] == pytest.approx(run["acceptance_length"])
    # the report holds the prompts and tokens: losslessness checks from the file alone
    assert report["prompt_ids"] == _prompts(3)
    assert report["tokens"] == [target_greedy(target, p, 10) for p in _prompts(3)]
    other = tmp_path / "small"
    from dflash.model.target import build_tiny_qwen3
    build_tiny_qwen3(OmegaConf.structured(TargetConfig(hidden_size=32, num_attention_heads=2,
                                                       num_key_value_heads=1))).save_pretrained(other)
    bad = run_module("dflash.eval", *args[:2], f"model.target.path={other}",
                     f"hydra.run.dir={tmp_path}/run2", check=False)
    assert bad.returncode != 0 and "does not fit the target" in bad.stderr


def test_speed_times_plain_and_drafted_greedy_decoding_at_batch_one(tmp_path, target):
    """speed=true: each prompt decoded plainly and with the drafter at batch 1, timed:
    the same tokens (greedy is lossless), tokens/s of each, and the speedup they give with
    an interval; the plain decoder is the target's own greedy continuation."""
    import json
    from dflash.decode import PlainProposer
    from dflash.eval.speed import measure_speed
    from dflash.model.checkpoint import save_drafter
    from tests.helpers.run import run_module
    prompts = _prompts(4)
    plain = speculative_decode(target, PlainProposer(), prompts[:1], 12, batch_size=1)
    assert plain.tokens[0] == target_greedy(target, prompts[0], 12)
    assert set(plain.accept_lengths[0]) == {1}  # one token a step
    torch.manual_seed(0)
    drafter = DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig())))
    s = measure_speed(target, drafter, prompts, 12)
    assert s["outputs_equal"] and s["batch_size"] == 1 and len(s["per_prompt"]) == 4
    assert s["plain_tokens_per_second"] > 0 and s["drafter_tokens_per_second"] > 0
    sp = s["speedup"]  # (timings: the interval is checked for order only, never a figure)
    assert 0 < sp["lo"] <= sp["hi"]
    assert sp["value"] == pytest.approx(s["drafter_tokens_per_second"] / s["plain_tokens_per_second"])
    # through the app: the report's `speed`, and greedy only
    target.lm.save_pretrained(tmp_path / "target")
    save_drafter(drafter, tmp_path / "drafter")
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    args = [f"drafter={tmp_path}/drafter", f"prompts={tmp_path}/p.jsonl",
            f"model.target.path={tmp_path}/target", "max_new_tokens=8", "speed=true",
            f"out={tmp_path}/r.json", f"hydra.run.dir={tmp_path}/run"]
    proc = run_module("dflash.eval", *args)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["speed"]["outputs_equal"] and "speedup" in proc.stdout
    bad = run_module("dflash.eval", *args, "temperature=0.7", check=False)
    assert bad.returncode == 2 and "speed=true times greedy decoding" in bad.stderr


@pytest.mark.parametrize("drafter, prompts, extra, named", [
    ("missing", "ok", [], "drafter checkpoint .*missing: no such directory"),
    ("cut", "ok", [], r"model.safetensors is corrupt"),
    ("ok", "bad", [], r"prompts.jsonl:2: invalid JSON"),
    ("ok", "ok", ["paths={tmp}"], r"is not a dflash data set: missing meta.json"),
    ("ok", "ok", ["num_prompts=0"], r"num_prompts=0: must be >= 1, or -1"),
    ("ok", "ok", ["temperature=-0.5"], r"temperature=-0.5: must be 0"),
    ("ok", "ok", ["baselines=[lookupp]"], r"unknown baseline 'lookupp'"),
    ("ok", "ok", ["baselines=[drafter:{tmp}/cut]"], r"cut/model.safetensors is corrupt"),
    ("ok", "ok", ["baselines=[ngram]", "ngram_data={tmp}"], r"is not a dflash data set"),
])
def test_a_bad_drafter_prompt_file_or_data_set_is_refused_before_the_target_loads(
        tmp_path, target, drafter, prompts, extra, named):
    """The target is the slow part to load (minutes for a large one): what the user gives
    besides it is read first. Here no target exists at all, so only an error about the
    other inputs proves the order."""
    import json
    import re

    from tests.helpers.run import run_module
    from dflash.model.checkpoint import save_drafter

    ok = tmp_path / "ok"
    save_drafter(DFlashDrafter(DrafterSpec.from_target(
        target, OmegaConf.structured(DrafterConfig()))), ok)
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "config.json").write_text((ok / "config.json").read_text())
    (cut / "model.safetensors").write_bytes((ok / "model.safetensors").read_bytes()[:100])
    good = json.dumps({"prompt_ids": [1, 2]}) + "\n"
    (tmp_path / "prompts.jsonl").write_text(good + ("{\n" if prompts == "bad" else ""))
    proc = run_module("dflash.eval", f"drafter={tmp_path / drafter}",
                      f"prompts={tmp_path}/prompts.jsonl", f"model.target.path={tmp_path}/none",
                      *[e.format(tmp=tmp_path) for e in extra],
                      f"hydra.run.dir={tmp_path}/run", check=False)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert re.search(named, last) and f"{tmp_path}/none" not in last, last
