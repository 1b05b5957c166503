"""Preflight: a command read as its launcher reads it, refused in one line where its real
start would refuse it, and the drafter derived from any target's own files."""
import pytest

from dflash.preflight.__main__ import main
from dflash.preflight.checks import Session, check
from dflash.errors import ConfigError
from dflash.preflight.command import AUTO, parse
from dflash.preflight.world import World
from tests.helpers.model_fixtures import write_model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {name: write_model(root, name) for name in
            ("Qwen3-8B", "Qwen3-32B", "Llama-3.1-8B", "Llama-3.1-70B")}


def test_a_command_is_read_as_its_launcher_reads_it():
    c = parse("NCCL_DEBUG=INFO torchrun --nnodes=4 --nproc-per-node 8 --rdzv-backend=c10d "
              "--rdzv-endpoint=$HEAD:29500 -m dflash.train experiment=production \\\n  seed=1")
    assert (c.module, c.nnodes, c.nproc_per_node, c.world_size) == ("dflash.train", 4, 8, 32)
    assert c.env == {"NCCL_DEBUG": "INFO"} and c.overrides == ["experiment=production", "seed=1"]
    m = parse('make train ARGS="epochs=2 batching=random"')
    assert m.module == "dflash.train" and m.overrides == ["epochs=2", "batching=random"]
    s = parse("python -m dflash.regenerate -m hydra/launcher=submitit_slurm "
              "hydra.launcher.nodes=4 hydra.launcher.tasks_per_node=8 out=o.jsonl")
    assert (s.nnodes, s.nproc_per_node, s.multirun) == (4, 8, True)
    assert World.parse("4x8x80") == World(4, 8, 80.0) and not World.parse("cpu").has_gpu
    # torchrun's own words for one process a GPU; anything else is refused by name
    a = parse("torchrun --nproc_per_node=gpu -m dflash.train experiment=production ~eval")
    assert a.nproc_per_node == AUTO and a.overrides == ["experiment=production", "~eval"]
    with pytest.raises(ConfigError, match=r"--nproc_per_node=x: give a number, auto or gpu"):
        parse("torchrun --nproc_per_node=x -m dflash.train")


@pytest.mark.parametrize("command, refusal", [
    # a typo of a recipe's name composed the CPU defaults silently (an optional group)
    ("python -m dflash.train experiment=prodution", "Could not find 'experiment/prodution'"),
    ("python -m dflash.plan experiment=prodution", "Could not find 'experiment/prodution'"),
    # a word Hydra refuses at the real start was dropped here
    ("python -m dflash.train experiment=production topology single_gpu",
     "'topology' is not a Hydra override"),
    ("torchrun --nproc_per_node=auto -m dflash.train", "this world has none: give a number"),
])
def test_a_command_its_real_start_refuses_is_refused_before_anything_is_read(command, refusal):
    rep = check(parse(command), World.parse("cpu"))
    assert not rep.ok and refusal in rep.refused, rep.refused


@pytest.mark.parametrize("name, taps, mask", [
    ("Qwen3-8B", [1, 9, 17, 25, 33], 151669),  # the published Qwen3-8B drafters' values
    ("Qwen3-32B", [1, 16, 31, 46, 61], 151669),
    ("Llama-3.1-8B", [1, 8, 15, 22, 29], 128255),  # <|reserved_special_token_247|>
    ("Llama-3.1-70B", [1, 20, 39, 58, 77], 128255),
])
def test_taps_and_mask_token_come_from_the_targets_own_files(models, name, taps, mask, tmp_path,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    # model=hf (any causal LM): its taps and mask are derived from the target's files
    rep = check(parse(f"python -m dflash.train model=hf data=tokenized data.path=data/ "
                      f"model.target.path={models[name]}"), World.parse("cpu"))
    rows = dict(rep.rows)
    assert rep.ok and rows["taps"] == str(taps)
    assert rows["drafter"].endswith(f"mask id {mask}"), rows["drafter"]


@pytest.mark.parametrize("command, world, refusal", [
    # a topology's replica count against the processes started
    ("torchrun --nproc_per_node=8 -m dflash.train experiment=production data.path=d", "1x8x80",
     "start at most 4 processes per node"),
    ("torchrun --nproc_per_node=4 -m dflash.train experiment=production topology.dp_size=8 "
     "data.path=d",
     "1x8x80", "plans for dp_size=8 data-parallel processes but 4 were started"),
    ("torchrun --nnodes=4 --nproc_per_node=8 -m dflash.train experiment=production "
     "topology=8gpu topology.target_tp=8 data.path=d", "4x8x80", "leave topology.target_devices"),
    # heads that do not split
    ("torchrun --nproc_per_node=6 -m dflash.train experiment=production topology=pairs "
     "topology.target_tp=3 data.path=d", "1x8x80", "does not divide the target's num_attention_heads"),
    # a tap past the target's depth, and its last layer
    ("python -m dflash.train experiment=production topology=single_gpu "
     "model.target.layer_ids=[1,40] data.path=d", "1x1x80", "outside the target's 36 layers"),
    ("python -m dflash.train experiment=production topology=single_gpu "
     "model.target.layer_ids=[1,35] data.path=d", "1x1x80", "taps layer 35, the target's last"),
    # a mask id the chat template renders, or past the vocabulary
    ("python -m dflash.train experiment=production topology=single_gpu "
     "model.drafter.mask_token_id=151644 data.path=d", "1x1x80", "a token the chat template renders"),
    ("python -m dflash.train experiment=production topology=single_gpu "
     "model.drafter.mask_token_id=200000 data.path=d", "1x1x80", "outside the target's embedding"),
    # DSpark's heads without their objective
    ("python -m dflash.train experiment=production topology=single_gpu drafter_head=dspark "
     "data.path=d", "1x1x80", "trains with loss=dspark"),
    # a real target on the CPU of a GPU machine
    ("python -m dflash.train data=tokenized data.path=d model=hf", "1x8x80",
     "on CPU although the world has GPUs"),
    # a step that does not fit
    pytest.param("python -m dflash.train experiment=production topology=single_gpu "
                 "data.path=d optim.micro_rows=0", "1x1x80", "set optim.micro_rows=",
                 marks=pytest.mark.slow),  # (three 8B estimates: ~18 s)
    # a setting that cannot work, as the real start's first check refuses it
    ("python -m dflash.train experiment=production topology=single_gpu optim.lr=0 "
     "data.path=d", "1x1x80", "optim.lr=0.0: must be > 0"),
    # the recipe without its data
    ("python -m dflash.train experiment=production topology=single_gpu", "1x1x80",
     "data=tokenized needs data.path=DIR"),
])
def test_what_the_real_start_refuses_is_refused_in_one_line(models, command, world, refusal,
                                                             tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rep = check(parse(f"{command} model.target.path={models['Qwen3-8B']}"), World.parse(world))
    assert not rep.ok and refusal in rep.refused, rep.refused
    assert "\n" not in rep.refused


def test_a_dir_the_run_writes_under_a_file_is_refused_as_the_app_refuses_it(tmp_path):
    (tmp_path / "f").write_text("")
    for key in ("hydra.run.dir", "data.cache_dir"):
        rep = check(parse(f"python -m dflash.train data=synthetic {key}={tmp_path / 'f' / 'd'}"),
                    World.parse("cpu"))
        assert rep.refused == f"{key}={tmp_path / 'f' / 'd'}: {tmp_path / 'f'} is a file, not a directory"


def test_a_guide_is_checked_in_order(models, tmp_path, monkeypatch):
    """prepare's --max-seq-len is what the next train's data holds, and its token ids are
    the model's it names."""
    monkeypatch.chdir(tmp_path)
    session, q8 = Session(), models["Qwen3-8B"]
    check(parse(f"python -m dflash.data.prepare --jsonl r.jsonl --tokenizer {q8} --out data/"),
          World.parse("cpu"), session)
    long = check(parse(f"torchrun --nproc_per_node=4 -m dflash.train experiment=production "
                       f"data.path=data/ model.target.path={q8}"), World.parse("1x8x80"), session)
    assert "keeps samples of up to 8192 tokens" in long.refused and "--max-seq-len 3072" in long.refused
    tiny = check(parse("python -m dflash.train data=tokenized data.path=data/"),
                 World.parse("cpu"), session)
    assert f"model=hf model.target.path={q8}" in tiny.refused


def test_resume_auto_in_a_dir_of_another_run_is_refused_before_the_gpus_are_booked(
        models, tmp_path, monkeypatch, capsys):
    """Two production experiments on two models never share a run dir; one run changed
    and rerun in its dir is refused naming the key."""
    import json
    from dflash.config import compose
    from dflash.run.identity import identity
    monkeypatch.chdir(tmp_path)
    base = "python -m dflash.train experiment=production topology=cpu data.path=d"
    a = check(parse(f"{base} model.target.path={models['Qwen3-8B']}"), World.parse("cpu"))
    b = check(parse(f"{base} model.target.path={models['Llama-3.1-8B']}"), World.parse("cpu"))
    dir_a, dir_b = dict(a.rows)["run dir"], dict(b.rows)["run dir"]
    assert dir_a != dir_b and "Qwen3-8B" in dir_a and "Llama-3.1-8B" in dir_b
    cfg = compose("train", ["experiment=production", "topology=cpu", "data.path=d",
                            f"model.target.path={models['Qwen3-8B']}"])
    ckpt = tmp_path / dir_a / "checkpoints" / "step-000000010"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"identity": identity(cfg)}))
    rc = main(["--world", "cpu", "--", f"{base} optim.lr=1e-3 "
               f"model.target.path={models['Qwen3-8B']}"])
    out = capsys.readouterr().out
    assert rc == 2 and "holds another run: optim.lr 0.0006 -> 0.001" in out


def _small_qwen3(layers: int):
    """A target small enough to run the step on real tensors too (vocab 4096, width 128)."""
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=4096, hidden_size=128, intermediate_size=384,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=32, tie_word_embeddings=False)


def _small_step_config(*overrides):
    from dflash.config import compose
    return compose("train", ["model=hf", "model.target.path=/x", "model.target.dtype=float32",
                             "model.drafter.num_anchors=512", "model.drafter.num_layers=2",
                             *overrides])


@pytest.mark.parametrize("micro", [0, 2])
def test_the_estimate_is_what_memtracker_sees_on_real_tensors(micro):
    """One small step, fake tensors against real ones under torch's MemTracker: the same
    target peak; the drafter's differs by exactly the context and LM head, which
    MemTracker counts again when the step reads them (allocated before it)."""
    from dflash.preflight.memory import estimate
    hc = _small_qwen3(8)
    cfg = _small_step_config(f"optim.micro_rows={micro}")
    fake = estimate(hc, cfg, 4, 128, 16, 4095, queue_depth=0)
    real = estimate(hc, cfg, 4, 128, 16, 4095, queue_depth=0, real=True)
    assert fake.target_gib == pytest.approx(real.target_gib, rel=0.01)
    twice = (4 * 128 * 5 * 128 * 4 + 4096 * 128 * 4) / 2**30  # context + LM head, fp32
    assert real.drafter_gib - fake.drafter_gib == pytest.approx(twice, rel=0.01)
    assert fake.drafter_gib > 2 * twice  # (the step's own memory is what is compared)


def test_dsparks_first_row_chunks_give_the_peak_of_every_chunk():
    """DSpark's checkpointed vocabulary rows: the estimate runs their first two chunks
    (every chunk holds the same memory), the peak of all of them, in a fraction of the ops."""
    from dflash.preflight.memory import estimate
    hc = _small_qwen3(4)
    cfg = _small_step_config("loss=dspark", "drafter_head=dspark", "model.loss_chunk_mb=1")
    first = estimate(hc, cfg, 4, 128, 16, 4095, queue_depth=0)  # 960 rows: 60 chunks of 16
    every = estimate(hc, cfg, 4, 128, 16, 4095, queue_depth=0, every_chunk=True)
    assert first.target_gib == every.target_gib
    assert first.drafter_gib == pytest.approx(every.drafter_gib, rel=2e-3)
