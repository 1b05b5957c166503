"""topology.target_tp: a target sharded by transformers' TP plan over real gloo ranks
gives every rank the hidden states one process computes, and a training run with it
takes the same steps as the run without it on the same global batches."""
import json
import os

import pytest
import torch
import torch.multiprocessing as mp

from dflash.topology import shutdown_process_group

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
    b, s = ((3, 11), (2, 17), (4, 9), (1, 23))[rank]
    ids = torch.randint(3, 300, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[0, s - 4:] = 0
    pos = torch.cat([torch.arange(s // 2), torch.arange(s - s // 2)])[None].expand(b, -1)
    return ids, mask, pos.contiguous()


def _hidden_diffs(world, paths, tp: int = 0) -> dict:
    """Max abs diff of each context of a TP target against the same model whole."""
    from omegaconf import OmegaConf
    from torch.distributed.device_mesh import init_device_mesh

    from dflash.config import TargetConfig
    from dflash.model.target import Target
    from dflash.model.tp_target import TensorParallelTarget
    rank = torch.distributed.get_rank()
    tp = tp or world  # as dflash.topology lays groups out: `tp` consecutive ranks
    mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))["tp"]
    diffs = {}
    for kind, path in paths.items():
        cfg = OmegaConf.structured(TargetConfig(path=path))
        tp, one = TensorParallelTarget.load(cfg, mesh), Target.from_config(cfg)
        ids, mask, pos = _rows(rank)
        for name, kw in (("padded", {"attention_mask": mask}), ("packed", {"position_ids": pos}),
                         ("final", {"attention_mask": mask, "final": True})):
            diffs[f"{kind} {name}"] = (tp.context(ids, **kw) - one.context(ids, **kw)).abs().max().item()
        assert torch.equal(tp.lm_head_weight, one.lm_head_weight)
        assert torch.equal(tp.embed_tokens.weight, one.embed_tokens.weight)
    return diffs


def _groups_rank(rank, world, port, paths, result):
    """Hidden states only, with world / 2 TP groups of 2 side by side."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    try:
        every = [None] * world
        torch.distributed.all_gather_object(every, _hidden_diffs(world, paths, tp=2))
        if rank == 0:
            torch.save(every, result)
        torch.distributed.barrier()
    finally:
        shutdown_process_group()


def _tp_rank(rank, world, port, cache, out, paths, result):
    """Every check in one pair of processes (one start): the hidden states, then the
    training runs without TP, with it, and resumed with it."""
    from dflash.loggers import JsonlLogger
    from tests.helpers.run import build_trainer
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    runs = {}
    torch.distributed.init_process_group("gloo")
    every = [None] * world
    torch.distributed.all_gather_object(every, _hidden_diffs(world, paths))
    runs["hidden"] = every
    common = ["logger.progress=false", "eval.enabled=false", "logger.log_every=1",
              "topology=pairs", "topology.device=cpu", "optim.max_steps=8",
              "checkpoint.every_steps=4"]
    try:
        # the TP run warms its shapes first (every rank at once: the sharded target's
        # forward is a collective), which must change nothing (warm == unwarmed)
        for tp, name, resume, warmup in (
                (1, "1", "never", "none"), (2, "2", "never", "all"),
                (2, "resumed", str(out / "2" / "checkpoints" / "step-000000004"), "none")):
            tr = build_trainer(cache, out / name, *common, f"topology.target_tp={tp}",
                               f"resume={resume}", f"warmup={warmup}")
            summary = tr.train(JsonlLogger(out / name / "metrics.jsonl"))
            if rank == 0:
                lines = (out / name / "metrics.jsonl").read_text().splitlines()
                runs[name] = ([json.loads(x)["loss"] for x in lines if "loss" in json.loads(x)],
                              {k: v.detach().clone() for k, v in tr.drafter.state_dict().items()},
                              summary["steps"], type(tr.target).__name__,
                              len((summary.get("warmup") or {}).get("per_shape", [])))
        runs["eval"] = _eval_tp(rank, tr, out)
        if rank == 0:
            torch.save(runs, result)
        torch.distributed.barrier()
    finally:
        shutdown_process_group()  # as dflash's own ranks end


def _eval_tp(rank, tr, out):
    """dflash.eval of the trained drafter with its target whole on each rank, then
    sharded over the two (topology.target_tp=2): the same tokens and acceptance."""
    from dflash.config import compose
    from dflash.evaluate import main_app
    from dflash.model.checkpoint import save_drafter
    if rank == 0:
        save_drafter(tr.drafter, out / "eval_drafter")
        prompts = [{"prompt_ids": [int(t) for t in p]} for p in tr.sources.eval_prompts[:3]]
        (out / "eval_prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    torch.distributed.barrier()
    reports = {}
    for tp in (1, 2):
        cfg = compose("eval", [f"drafter={out / 'eval_drafter'}", f"prompts={out / 'eval_prompts.jsonl'}",
                               f"model.target.path={tr.sources.target_dir}", "device=cpu",
                               "topology=pairs", "topology.device=cpu", f"topology.target_tp={tp}",
                               "max_new_tokens=16"])
        r = main_app(cfg)
        reports[tp] = (r["tokens"], r["acceptance_length"])
    return reports


@pytest.mark.slow
def test_a_tp_target_gives_one_process_hidden_states_and_training(tmp_path, world_cache):
    """2 gloo ranks. The target sharded 2 ways gives every rank the hidden states one
    process computes, for a Qwen3 and a Llama (padded, packed and final contexts). Then
    each rank trains on its own batches with the target whole or sharded: the same
    steps, losses step by step within 1e-4 (the TP all-reduce sums in another order),
    final weights allclose; and a TP run resumed from its step-4 checkpoint ends
    bit-identical to the one that went on."""
    from tests.integration.test_distributed_plans import _free_port
    paths = {}
    for kind in FAMILIES:
        _save_tiny(kind, tmp_path / kind)
        paths[kind] = str(tmp_path / kind)
    mp.spawn(_tp_rank, args=(2, _free_port(), world_cache, tmp_path, paths,
                             str(tmp_path / "r.pt")), nprocs=2)
    runs = torch.load(tmp_path / "r.pt")
    worst = {k: max(d[k] for d in runs["hidden"]) for k in runs["hidden"][0]}
    print("max abs diff, TP=2 vs one process (fp32):", worst)
    assert len(worst) == 2 * 3 and all(v < 1e-5 for v in worst.values()), worst
    (base_l, base_w, base_n, base_t, _), (tp_l, tp_w, tp_n, tp_t, warmed) = runs["1"], runs["2"]
    assert (base_t, tp_t) == ("Target", "TensorParallelTarget") and warmed >= 2
    assert len(base_l) == len(tp_l) == 8 and base_n == tp_n == 8
    assert max(abs(a - b) for a, b in zip(base_l, tp_l)) < 1e-4, (base_l, tp_l)
    assert base_l[0] > base_l[-1]  # it trained
    assert all(torch.allclose(base_w[k], tp_w[k], atol=1e-4) for k in base_w)
    # resumed under TP from the step-4 checkpoint: bit-identical to the run that went on
    res_l, res_w, _, _, _ = runs["resumed"]
    assert res_l == tp_l[4:] and all(torch.equal(res_w[k], tp_w[k]) for k in tp_w)
    # dflash.eval with the target sharded: the tokens and acceptance one process gives
    whole, sharded = runs["eval"][1], runs["eval"][2]
    assert whole[0] == sharded[0] and len(whole[0]) == 3
    assert whole[1] == pytest.approx(sharded[1])


@pytest.mark.slow
def test_two_tp_groups_side_by_side_give_one_process_hidden_states(tmp_path):
    """4 gloo ranks, `target_tp=2`: two TP groups, each rank its own batch width. Before,
    transformers sharded the target over all 4 ranks and built each group's meshes alone,
    and the groups' all-reduces met ("Received data size doesn't match expected size")."""
    from tests.integration.test_distributed_plans import _free_port
    _save_tiny("qwen3", tmp_path / "qwen3")
    mp.spawn(_groups_rank, args=(4, _free_port(), {"qwen3": str(tmp_path / "qwen3")},
                                 str(tmp_path / "r.pt")), nprocs=4)
    every = torch.load(tmp_path / "r.pt")
    worst = {k: max(d[k] for d in every) for k in every[0]}
    print("max abs diff, 2 TP groups of 2 vs one process (fp32):", worst)
    assert len(every) == 4 and len(worst) == 3 and all(v < 1e-5 for v in worst.values()), worst
