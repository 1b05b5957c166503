"""The closed shape set, the warm run and the compile monitor."""
import json

import torch

from tests.helpers.run import build_trainer, WORLD, run_module


COMPILED = [*WORLD, "eval.enabled=false", "epochs=1", "logger.progress=false",
            "model.compile=static", "warmup.pad_to_multiple=256", "warmup.batch_sizes=[16]",
            # dynamo's graphs, guards and recompiles as inductor gets them, without its
            # ~40 s of code generation per shape on 2 cores (gpu_check runs inductor)
            "model.compile_backend=eager"]

def test_padding_rows_carry_nothing(world_cache):
    from dflash.warmup.shapes import Shape
    from tests.helpers.batches import collate
    r = build_trainer(world_cache, "/tmp/unused", "logger.progress=false")
    batch = r.shard(0)[0]
    shape = Shape(batch.batch_size + 3, batch.seq_len + 5, 32)
    b = collate(r.dataset, batch, torch.device("cpu"), shape)
    assert tuple(b.ids.shape) == (shape.batch_size, shape.seq_len)
    assert not b.valid[batch.batch_size:].any() and not b.loss_mask[batch.batch_size:].any()
    natural = collate(r.dataset, batch, torch.device("cpu"))
    assert torch.equal(b.ids[:batch.batch_size, :batch.seq_len], natural.ids)
    ctx = r.train_step.context(b)
    assert torch.isfinite(ctx).all()  # an all-padding row keeps the target's softmax defined
    # the real rows' context does not depend on the padding around them
    torch.testing.assert_close(ctx[:batch.batch_size, :batch.seq_len], r.train_step.context(natural))


def _params(runner):
    return {k: v.detach().clone() for k, v in runner.drafter.state_dict().items()}


def test_warmup_does_not_change_training(tmp_path, world_cache):
    from dflash.loggers import Logger
    outs = []
    for policy in ("all", "none"):
        r = build_trainer(world_cache, tmp_path / policy, "logger.progress=false",
                          f"warmup={policy}", "epochs=1", "optim.max_steps=6")
        summary = r.train(Logger())
        outs.append((summary, _params(r)))
    (warm, pw), (cold, pc) = outs
    assert len(warm["warmup"]["per_shape"]) == warm["warmup"]["num_warm_shapes"] > 0
    assert warm["warmup_shapes"] and cold["warmup_shapes"] == []
    assert all(torch.equal(pw[k], pc[k]) for k in pw)


def test_static_compile_after_warmup_compiles_nothing(tmp_path, world_cache):
    runs = {}
    for policy in ("all", "none"):  # `none` second: it reads the compile cache `all` filled
        run = tmp_path / policy
        run_module("dflash.train", *COMPILED, f"warmup={policy}", f"data.cache_dir={world_cache}",
                   f"hydra.run.dir={run}")
        runs[policy] = json.loads((run / "summary.json").read_text())
    warm, cold = runs["all"], runs["none"]
    shapes = {tuple(s) for s in warm["warmup_shapes"]}
    assert len(shapes) >= 2 and warm["compiles_after_warmup"] == 0 and warm["compile_events"] == []
    assert warm["warmup"]["steps_covered"] == 1.0
    # without warmup every shape compiles mid-training, and the monitor names each one
    assert cold["compiles_after_warmup"] > 0
    named = {tuple(e["shape"]) for e in cold["compile_events"]}
    assert named == shapes
    assert all(e["dynamo_graphs"] >= 1 and e["step"] >= 1 for e in cold["compile_events"])


def test_on_compile_stop_names_the_shape(tmp_path, world_cache):
    proc = run_module("dflash.train", *COMPILED, "warmup=none", "warmup.on_compile=stop",
                      f"data.cache_dir={world_cache}", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode != 0
    assert "warmup.on_compile=stop" in proc.stderr and "shape [batch 16, length" in proc.stderr


def test_compile_refuses_the_eager_only_chunked_attention(tmp_path, world_cache):
    """The chunked mask's key windows are data-dependent: compiled, every batch would
    recompile. Asking for both fails at start; `auto` under compile takes the dense mask."""
    proc = run_module("dflash.train", *COMPILED, "model.attention=chunked", "warmup=none",
                      f"data.cache_dir={world_cache}", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode != 0
    assert "model.attention=chunked" in proc.stderr and "eager only" in proc.stderr


def test_an_unknown_compile_backend_is_refused_naming_the_key(tmp_path, world_cache):
    import pytest
    from dflash.errors import ConfigError
    with pytest.raises(ConfigError, match=r"model.compile_backend=indcutor is not a torch.compile backend"):
        build_trainer(world_cache, tmp_path, *COMPILED[len(WORLD):], "model.compile_backend=indcutor")
