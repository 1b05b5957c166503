"""The main job end to end: the real entry point, the world, and what the summary says."""
import json
import re

import pytest
import torch

from tests.helpers.run import build_trainer, WORLD, run_module
from dflash.model.checkpoint import load_drafter

SUMMARY_KEYS = {"steps", "samples_seen", "tokens_per_second", "padded_tokens_per_second",
                "padding_efficiency", "initial_loss", "final_loss", "initial_acceptance_length",
                "acceptance_length", "warmup_shapes", "compiles_after_warmup", "strategy",
                "wall_seconds"}


@pytest.fixture
def cache(world_cache):
    return world_cache


# 10 epochs of the session world's 400 samples (built once for every test): ~320 steps;
# the drafter takes off after ~120 (retrieval is learned suddenly)
TAKEOFF = ["epochs=10"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, world_cache):
    """One run of the real entry point, long enough for the drafter to take off; the
    entry-point test reads its files, the ablation test its drafter."""
    run = tmp_path_factory.mktemp("entry") / "run"
    proc = run_module("dflash.train", *WORLD, f"data.cache_dir={world_cache}", *TAKEOFF,
                      "logger.log_every=5", f"hydra.run.dir={run}")
    (run / "stderr.txt").write_text(proc.stderr)  # the progress bar's last state
    return run


def test_train_entry_point_end_to_end(trained_run):
    run = trained_run
    summary = json.loads((run / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["strategy"] == "bucketed" and summary["steps"] > 20
    assert summary["final_loss"] < 0.8 * summary["initial_loss"]
    assert 0 < summary["padding_efficiency"] <= 1
    assert summary["tokens_per_second"] == pytest.approx(
        summary["padded_tokens_per_second"] * summary["padding_efficiency"], rel=1e-6)
    assert summary["samples_seen"] == summary["epochs"] * summary["data"]["num_samples"]
    # acceptance is measured (by real decoding) before and after; that training raises
    # it is the ablation test's job
    assert summary["acceptance_length"] >= 1 and summary["initial_acceptance_length"] >= 1
    assert summary["eval"]["after"]["verify_steps"] >= 6 * 32 / 16
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines][:3] == [1, 5, 10] and lines[-1]["step"] == summary["steps"]
    for r in lines:
        assert {"step", "epoch", "loss", "lr", "tokens_per_second", "padding_efficiency"} <= set(r)
    drafter = load_drafter(run / "drafter")
    assert drafter.spec.target_layer_ids == [1, 2, 3] and drafter.spec.block_size == 16
    assert (run / "resolved_config.yaml").exists() and (run / ".hydra" / "config.yaml").exists()
    prompts = (run / "eval_prompts.jsonl").read_text().splitlines()
    assert len(prompts) == 6 and "prompt_ids" in json.loads(prompts[0])
    # the bar counts to the steps the run takes, and gets there
    bars = re.findall(r"train bucketed:\s+(\d+)%\|[^|]*\|\s*(\d+)/(\d+)",
                      (run / "stderr.txt").read_text())
    assert bars and bars[-1] == ("100", str(summary["steps"]), str(summary["steps"])), bars[-1:]
    # the run's log file holds what the run printed, not 0 bytes
    log = (run / "train.log").read_text()
    assert "acceptance_length" in log and f"run dir: {run}" in log


def test_acceptance_is_reported_side_by_side_and_decoding_matches_its_estimate(trained_run):
    summary = json.loads((trained_run / "summary.json").read_text())
    gap = summary["acceptance"]
    assert gap["heldout_decoded"] == summary["acceptance_length"]
    for k in ("train_teacher_forced", "heldout_teacher_forced", "heldout_decode_path"):
        assert gap[k] > 1.5, gap
    tf, path = gap["heldout_teacher_forced_per_position"], gap["heldout_decode_path_per_position"]
    assert len(tf) == len(path) == len(gap["heldout_decoded_per_position"]) == 15
    assert all(a >= b for a, b in zip(tf, tf[1:]))
    # served as trained, the teacher-forced walk over the tokens decoding produced takes
    # the steps decoding took (fp32: only a near-tie could move one)
    assert gap["heldout_decode_path"] == pytest.approx(gap["heldout_decoded"], rel=0.02), gap
    assert gap["heldout_decode_path_per_position"] == pytest.approx(
        gap["heldout_decoded_per_position"], abs=0.03)
    assert gap["warning"] is None


def test_a_drafter_served_with_another_mask_token_is_flagged(tmp_path, cache, trained_run):
    import dataclasses
    from dflash.eval.decode import evaluate
    from dflash.eval.teacher_forced import acceptance_gap, teacher_forced_acceptance
    runner = _runner(cache, tmp_path, [*TAKEOFF, "warmup=none"])
    drafter = runner.drafter
    drafter.load_state_dict(load_drafter(trained_run / "drafter").state_dict())
    prompts = runner.sources.eval_prompts
    served = evaluate(runner.target, drafter, prompts, 32)  # as trained: the reference
    tf = teacher_forced_acceptance(runner.target, drafter,
                                   [list(map(int, p)) + t for p, t in zip(prompts, served.tokens)],
                                   [len(p) for p in prompts])
    drafter.spec = dataclasses.replace(drafter.spec, mask_token_id=5)  # an engine's other id
    wrong = evaluate(runner.target, drafter, prompts, 32).as_dict()
    gap = acceptance_gap(None, tf, wrong, 0.0)
    assert wrong["acceptance_length"] < served.acceptance_length - 0.5
    assert gap["warning"] and "mask token" in gap["warning"], gap


def test_a_run_warm_started_from_a_drafter_starts_where_it_ended(tmp_path, cache, trained_run):
    done = json.loads((trained_run / "summary.json").read_text())
    r = _runner(cache, tmp_path, [*TAKEOFF, f"model.drafter.init={trained_run / 'drafter'}",
                                  "optim.max_steps=2", "warmup=none"])
    summary = r.run()
    # the same prompts decoded by the same weights: the same acceptance
    assert summary["initial_acceptance_length"] == pytest.approx(done["acceptance_length"], abs=1e-9)
    # the first step's loss is the trained drafter's, not a fresh one's
    assert summary["initial_loss"] < 0.25 * done["initial_loss"], (summary["initial_loss"], done)
    assert summary["initial_loss"] < 3 * done["final_loss"] + 0.2, (summary["initial_loss"], done)


def test_a_warm_start_of_another_shape_names_the_field(tmp_path, cache, trained_run):
    from dflash.errors import DataError
    with pytest.raises(DataError, match=r"model.drafter.init=.*block_size is 16 there but 8"):
        _runner(cache, tmp_path, [f"model.drafter.init={trained_run / 'drafter'}",
                                  "model.drafter.block_size=8"])


def test_a_warm_start_that_cannot_load_is_refused_before_the_target_and_data(tmp_path):
    """No target or data exists here: only a refusal of model.drafter.init proves it is
    read first (a large target takes minutes to load)."""
    from dflash.config import compose
    from dflash.errors import DataError
    from dflash.trainer import Trainer
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "config.json").write_text('{"architectures": ["DFlashDraftModel"]}')
    (cut / "model.safetensors").write_bytes(b"\x10\x00")
    for init, named in [(tmp_path / "nope", "no such directory"), (cut, "is corrupt")]:
        cfg = compose("train", ["model=hf", f"model.target.path={tmp_path}/none", "data=tokenized",
                                f"data.path={tmp_path}/none", f"model.drafter.init={init}"])
        with pytest.raises(DataError, match=f"^model.drafter.init: .*{named}"):
            Trainer(cfg, tmp_path / "run").build()


def _runner(cache, out, overrides):
    return build_trainer(cache, out, "logger.progress=false", *overrides)


def test_drafter_beats_zeroed_context_and_ngram_lookup(tmp_path, cache, trained_run):
    """The world's replies are fixed by the prompt: only a drafter that reads the
    target's hidden states can draft them, and only it may score well."""
    from dflash.eval.ablation import context_ablation
    runner = _runner(cache, tmp_path, TAKEOFF)  # the run's data, target and prompts
    runner.drafter.load_state_dict(load_drafter(trained_run / "drafter").state_dict())
    scores = context_ablation(runner)
    assert scores["trained"] > scores["zero_context"] + 1.0, scores
    assert scores["trained"] > scores["ngram3"] + 1.0, scores
    # dflash.eval paths= scores only the blocks a greedy reply's decode path anchors at:
    # the steps of the walk over every block's streak, in lockstep over a batch of
    # replies of different lengths
    from dflash.eval.decode import DrafterProposer, speculative_decode
    from dflash.eval.teacher_forced import continuation_streaks, decode_path, path_steps
    prompts = runner.sources.eval_prompts
    res = speculative_decode(runner.target, DrafterProposer(runner.drafter, runner.target),
                             prompts, 24)
    seqs = [[*p, *t[:24 - i % 5]] for i, (p, t) in enumerate(zip(prompts, res.tokens))]
    firsts = [len(p) for p in prompts]
    walked = path_steps(runner.target, runner.drafter, seqs, firsts, batch_size=4)
    assert walked == [decode_path(s) for s in continuation_streaks(
        runner.target, runner.drafter, seqs, firsts, batch_size=4)]
    assert sum(map(len, walked)) < sum(map(sum, walked)) / 2  # drafts were accepted


def test_runner_is_deterministic_for_a_seed(tmp_path, cache):
    runs = []
    for i in range(2):
        r = _runner(cache, tmp_path / str(i), ["epochs=1", "optim.max_steps=4",
                                                "eval.enabled=false", "warmup=none"])
        r.run()
        runs.append(r.drafter.state_dict())
    for k in runs[0]:
        assert torch.equal(runs[0][k], runs[1][k]), k


def test_a_resumed_run_keeps_its_first_evaluation_and_another_runs_checkpoint_costs_none(
        tmp_path, cache):
    """The evaluation before training runs once a run: a resume takes it from the
    checkpoint (the same figure in its summary), and a checkpoint of another run is
    refused before it (minutes of decoding on a real target)."""
    from dflash.errors import DataError
    short = ["epochs=1", "optim.max_steps=4", "checkpoint.every_steps=2", "warmup=none",
             "eval.num_prompts=2", "eval.max_new_tokens=8"]

    def counted(r):
        r.evals = []
        evaluate = r.evaluate
        r.evaluate = lambda *a, **k: (r.evals.append(k.get("label")), evaluate(*a, **k))[1]
        return r

    first = counted(_runner(cache, tmp_path / "a", short))
    whole = first.run()
    step2 = tmp_path / "a" / "checkpoints" / "step-000000002"
    assert first.evals[0] == "eval before training" and step2.is_dir()
    again = counted(_runner(cache, tmp_path / "b", [*short, f"resume={step2}"]))
    resumed = again.run()
    assert resumed["resumed_from"] == str(step2) and "eval before training" not in again.evals
    assert resumed["initial_acceptance_length"] == whole["initial_acceptance_length"]
    other = counted(_runner(cache, tmp_path / "c", [*short, "optim.lr=1e-2", f"resume={step2}"]))
    with pytest.raises(DataError, match="optim.lr"):
        other.run()
    assert other.evals == []


def test_ctrl_c_checkpoints_and_prints_the_command_that_goes_on(tmp_path, cache):
    """The first Ctrl-C stops a run as a preemption does (it was a KeyboardInterrupt
    traceback and no checkpoint), without asking SLURM to requeue it."""
    import os
    import signal
    import threading
    import time
    run = tmp_path / "run"
    metrics = run / "metrics.jsonl"

    def press():  # once a step is logged, as a person at the terminal would
        deadline = time.time() + 120
        while not (metrics.exists() and metrics.stat().st_size) and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    ignore = signal.signal(signal.SIGINT, lambda *a: None)  # a late press never hits pytest
    presser = threading.Thread(target=press, daemon=True)
    presser.start()
    try:
        proc = run_module("dflash.train", *WORLD, f"data.cache_dir={cache}", "epochs=20",
                          "eval.enabled=false", "logger.progress=false", "logger.log_every=1",
                          "warmup=none", f"hydra.run.dir={run}")
    finally:
        presser.join()
        signal.signal(signal.SIGINT, ignore)
    summary = json.loads((run / "summary.json").read_text())
    steps = summary["steps"]
    assert summary["preempted"] == "SIGINT" and summary["requeued"] is None
    assert 0 < steps < 20 * summary["steps_per_epoch"]
    assert (run / "checkpoints" / f"step-{steps:09d}").is_dir()
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"dflash: SIGINT in {run}: checkpointed at step {steps}. To go on:")
    assert line.endswith(f"hydra.run.dir={run} resume=auto")


def test_anchor_slots_far_past_the_longest_sample_are_named_before_a_step(tmp_path, cache,
                                                                         caplog):
    """A typo (100000 for 1000) ran out of memory in the first step without a word."""
    import logging
    with caplog.at_level(logging.WARNING, logger="dflash.trainer"):
        r = _runner(cache, tmp_path, ["model.drafter.num_anchors=100000", "eval.enabled=false"])
    longest = int(r.sources.data.lengths.max())
    assert (f"model.drafter.num_anchors=100000: the longest sample has {longest} tokens"
            in caplog.text)


def test_runner_trains_packed_rows_in_one_shape(tmp_path, cache):
    r = _runner(cache, tmp_path, ["batching=packed", "epochs=1", "optim.max_steps=6",
                                  "eval.enabled=false", "warmup=all"])
    summary = r.run()
    assert summary["strategy"] == "packed" and summary["steps"] == 6
    # a row of ~8 documents gets the anchor slots they would get unpacked
    assert r.num_anchors > 4 * r.cfg.model.drafter.num_anchors
    # budget 4096 allows 4 rows of 1024, the cap of 16 samples a batch (x ~125 tokens) 2
    assert r.planner.rows_per_batch == 2
    assert summary["warmup_shapes"] == [[2, 1024, r.num_anchors]]
    assert summary["padding_efficiency"] > 0.95  # real tokens / row slots of the steps run
    assert summary["final_loss"] < summary["initial_loss"]
    first = r.shard(0)[0]
    assert first.row_of is not None and first.shape == (2, 1024)


def test_distillation_trains_through_the_runner(tmp_path, cache):
    """loss=kl through the real step (the target runs to its final norm, its final
    hidden state riding along the context): the loss falls and the teacher-forced
    acceptance rises. (loss=dpace shares the runner path of ce: tested at the loss,
    and 2 gloo ranks == 1 process.)"""
    r = _runner(cache, tmp_path, ["loss=kl", "epochs=1", "optim.max_steps=24",
                                  "eval.enabled=false", "logger.log_every=8", "warmup=none"])
    summary = r.run()
    assert r.train_step.objective.kind == "kl" and summary["steps"] == 24
    assert summary["final_loss"] < 0.8 * summary["initial_loss"], summary
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    accept = [x["accept_est"] for x in rows if "accept_est" in x]
    assert accept and accept[-1] > accept[0], accept


def test_a_local_llama_target_trains_and_is_recorded_as_trained(tmp_path):
    """model=hf: a local HF model of another family (a tiny Llama, tied embeddings)
    trains, and the run records the sizes that were trained (from its config.json), not
    the tiny model's defaults."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from omegaconf import OmegaConf
    from dflash.config import compose
    from dflash.trainer import Trainer
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=48, intermediate_size=96,
                                 num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
                                 tie_word_embeddings=True)).save_pretrained(tmp_path / "llama")
    cfg = compose("train", ["model=hf", f"model.target.path={tmp_path / 'llama'}",
                            "data=synthetic", "data.num_samples=48", f"data.cache_dir={tmp_path}",
                            "eval.enabled=false", "optim.max_steps=3", "logger.progress=false"])
    assert OmegaConf.to_container(cfg.model.target)["hidden_size"] is None
    summary = Trainer(cfg, tmp_path / "run").build().run()
    assert summary["steps"] == 3 and summary["final_loss"] is not None
    m = summary["model"]
    assert (m["target_hidden_size"], m["target_layers"], m["vocab_size"]) == (48, 5, 512)
    assert m["target_layer_ids"] == [1, 2] and m["mask_token_id"] == 511
