"""topology.target_tp: a target sharded by transformers' TP plan over real gloo ranks
gives every rank the hidden states one process computes, and a training run with it
takes the same steps as the run without it on the same global batches."""
import json
import os

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from dflash.topology import shutdown_process_group
from tests.helpers.paths import REPO
from tests.helpers.run import WORLD, torchrun_ok

FAMILIES = ("qwen3", "llama")


def _save_tiny(kind: str, path):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    cls, cfg_cls = ((Qwen3ForCausalLM, Qwen3Config) if kind == "qwen3"
                    else (LlamaForCausalLM, LlamaConfig))
    torch.manual_seed(0)
    cfg = cfg_cls(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=5,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  tie_word_embeddings=kind == "llama")
    cls(cfg).save_pretrained(path)


def _rows(rank):
    """Each rank its own batch: different rows, widths, padding and a packed case."""
    g = torch.Generator().manual_seed(10 + rank)
    b, s = (3, 11) if rank == 0 else (2, 17)
    ids = torch.randint(3, 300, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[0, s - 4:] = 0
    pos = torch.cat([torch.arange(s // 2), torch.arange(s - s // 2)])[None].expand(b, -1)
    return ids, mask, pos.contiguous()


def _rank(rank, world, store, paths, result):
    import torch.distributed as dist
    from omegaconf import OmegaConf
    from torch.distributed.device_mesh import init_device_mesh

    from dflash.config import TargetConfig
    from dflash.model.target import Target
    from dflash.model.tp_target import TensorParallelTarget
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))["tp"]
        diffs = {}
        for kind, path in paths.items():
            cfg = OmegaConf.structured(TargetConfig(path=path))
            tp, one = TensorParallelTarget.load(cfg, mesh), Target.from_config(cfg)
            ids, mask, pos = _rows(rank)
            for name, kw in (("padded", {"attention_mask": mask}), ("packed", {"position_ids": pos}),
                             ("final", {"attention_mask": mask, "final": True})):
                d = (tp.context(ids, **kw) - one.context(ids, **kw)).abs().max().item()
                diffs[f"{kind} {name}"] = d
            assert torch.equal(tp.lm_head_weight, one.lm_head_weight)
            assert torch.equal(tp.embed_tokens.weight, one.embed_tokens.weight)
        every = [None] * world
        dist.all_gather_object(every, diffs)
        if rank == 0:
            torch.save(every, result)
        dist.barrier()
    finally:
        shutdown_process_group()  # as dflash's own ranks end


def test_two_tp_ranks_give_the_hidden_states_of_one_process(tmp_path):
    paths = {}
    for kind in FAMILIES:
        _save_tiny(kind, tmp_path / kind)
        paths[kind] = str(tmp_path / kind)
    mp.spawn(_rank, args=(2, str(tmp_path / "store"), paths, str(tmp_path / "r.pt")), nprocs=2)
    every = torch.load(tmp_path / "r.pt")
    worst = {k: max(d[k] for d in every) for k in every[0]}
    print("max abs diff, TP=2 vs one process (fp32):", worst)
    assert len(worst) == 2 * 3 and all(v < 1e-5 for v in worst.values()), worst


def _train(tmp_path, cache, name, tp):
    import subprocess
    import sys
    out = tmp_path / name
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "-m", "dflash.train", *WORLD, f"data.cache_dir={cache}", "topology=pairs",
           "topology.device=cpu", f"topology.target_tp={tp}", "optim.max_steps=8",
           "logger.progress=false", "logger.log_every=1", "eval.enabled=false",
           f"hydra.run.dir={out}"]
    torchrun_ok(subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True,
                               timeout=300))
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    return losses, load_file(out / "drafter" / "model.safetensors"), json.loads(
        (out / "summary.json").read_text())


@pytest.mark.slow
def test_training_with_a_tp_target_equals_training_without(tmp_path, world_cache):
    """2 ranks, each its own batches: the target sharded 2 ways or whole on each rank.
    Same steps, losses step by step within 1e-4 (the TP all-reduce sums in another
    order), final weights allclose."""
    base_l, base_w, base_s = _train(tmp_path, world_cache, "no_tp", 1)
    tp_l, tp_w, tp_s = _train(tmp_path, world_cache, "tp", 2)
    assert len(base_l) == len(tp_l) == 8 and base_s["steps"] == tp_s["steps"] == 8
    assert max(abs(a - b) for a, b in zip(base_l, tp_l)) < 1e-4, (base_l, tp_l)
    assert base_l[0] > base_l[-1]  # it trained
    assert all(torch.allclose(base_w[k], tp_w[k], atol=1e-4) for k in base_w)
