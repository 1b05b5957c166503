"""Two gloo ranks training on batches A and B make the same update as one process on
A and B together (same anchors) under loss.norm=plan; the per-batch mean does not."""
import pytest
import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from dflash.config import DrafterConfig, TargetConfig
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.loss import Objective, drafter_loss, sample_anchors
from dflash.model.target import Target
from dflash.topology import shutdown_process_group

LENGTHS = [24, 30, 28, 26, 96, 90, 80, 88]  # A: 4 short rows, B: 4 long ones


def _setup():
    torch.manual_seed(0)
    target = Target.from_config(OmegaConf.structured(TargetConfig()))
    drafter = DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig())))
    g = torch.Generator().manual_seed(3)
    s = max(LENGTHS)
    ids = torch.randint(3, 500, (len(LENGTHS), s), generator=g)
    valid = torch.arange(s)[None] < torch.tensor(LENGTHS)[:, None]
    mask = (torch.arange(s)[None] >= 8) & valid
    anchors = sample_anchors(mask, valid, 8, torch.Generator().manual_seed(4))
    return target, drafter, ids, mask, valid, anchors


def _grads(drafter, target, rows, ids, mask, valid, anchors, objective):
    out = drafter_loss(drafter, target.context(ids[rows], valid[rows].long()), target.embed_tokens,
                       target.lm_head_weight, ids[rows], mask[rows], valid[rows], objective,
                       anchors=(anchors[0][rows], anchors[1][rows]))
    out.loss.backward()
    return out


def _rank(rank, world, store, result, norm, weight):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    target, drafter, ids, mask, valid, anchors = _setup()
    ddp = DDP(drafter)
    rows = slice(0, 4) if rank == 0 else slice(4, 8)
    _grads(ddp, target, rows, ids, mask, valid, anchors, Objective(8, norm=norm, batch_weight=weight))
    if rank == 0:
        torch.save({k: p.grad for k, p in drafter.named_parameters()}, result)
    dist.barrier()
    shutdown_process_group()  # as dflash's own ranks end: destroy alone can abort at exit


def _two_ranks(tmp_path, norm, weight):
    result = tmp_path / f"{norm}.pt"
    mp.spawn(_rank, args=(2, str(tmp_path / f"store-{norm}"), str(result), norm, weight), nprocs=2)
    return torch.load(result)


@pytest.mark.parametrize("norm", ["plan", "batch"])
def test_two_ranks_on_a_and_b_equal_one_process_on_both(tmp_path, norm):
    weight = 400.0  # the mean weight of one rank's batch; one process taking A and B as
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one batch has batches twice as heavy: 2 x weight
    try:
        ranks = _two_ranks(tmp_path, norm, weight)
        target, drafter, ids, mask, valid, anchors = _setup()
        out = _grads(drafter, target, slice(0, 8), ids, mask, valid, anchors,
                     Objective(8, norm=norm, batch_weight=2 * weight))
    finally:
        torch.set_num_threads(threads)
    one = {k: p.grad for k, p in drafter.named_parameters()}
    assert int(out.blocks) > 0
    close = all(torch.allclose(ranks[k], one[k], rtol=1e-4, atol=1e-7) for k in one)
    # plan: every block counts the same on either side; batch: a short-row rank's blocks
    # weigh more than a long-row rank's, so the update is not the one of A + B
    assert close == (norm == "plan")


def _dpace_rank(rank, world, store, result):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from dflash.step import ranks_sum
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    target, drafter, ids, mask, valid, anchors = _setup()
    ddp = DDP(drafter)  # held: its reducer averages the gradients in backward
    rows = slice(0, 4) if rank == 0 else slice(4, 8)
    out = drafter_loss(ddp, target.context(ids[rows], valid[rows].long()),
                       target.embed_tokens, target.lm_head_weight, ids[rows], mask[rows],
                       valid[rows], Objective(8, norm="plan", kind="dpace"),
                       anchors=(anchors[0][rows], anchors[1][rows]), reduce_sum=ranks_sum)
    out.loss.backward()
    if rank == 0:
        torch.save({k: p.grad for k, p in drafter.named_parameters()}, result)
    dist.barrier()
    shutdown_process_group()


def test_dpace_two_ranks_on_a_and_b_equal_one_process_on_both(tmp_path):
    """D-PACE's denominator is the weight of the whole step over every rank (a
    rank-local one would make the update depend on how the step is split)."""
    result = tmp_path / "dpace.pt"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mp.spawn(_dpace_rank, args=(2, str(tmp_path / "store-dpace"), str(result)), nprocs=2)
        target, drafter, ids, mask, valid, anchors = _setup()
        _grads(drafter, target, slice(0, 8), ids, mask, valid, anchors,
               Objective(8, norm="plan", kind="dpace"))
    finally:
        torch.set_num_threads(threads)
    ranks = torch.load(result)
    for k, p in drafter.named_parameters():
        torch.testing.assert_close(ranks[k], p.grad, rtol=1e-4, atol=1e-7)


# a DSpark drafter: Markov head, confidence head, anchor-first blocks
DSPARK = dict(markov_rank=16, confidence_head=True, sample_from_anchor=True)


def _dspark_setup():
    target, _, ids, mask, valid, anchors = _setup()
    torch.manual_seed(0)
    drafter = DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig(**DSPARK))))
    torch.nn.init.normal_(drafter.markov_head.markov_w2.weight, std=0.1)  # (zero at init)
    return target, drafter, ids, mask, valid, anchors


def _dspark_loss(drafter, target, rows, ids, mask, valid, anchors, reduce_sum=None):
    return drafter_loss(drafter, target.context(ids[rows], valid[rows].long(), final=True),
                        target.embed_tokens, target.lm_head_weight, ids[rows], mask[rows],
                        valid[rows], Objective(8, norm="plan", kind="dspark"),
                        anchors=(anchors[0][rows], anchors[1][rows]), reduce_sum=reduce_sum)


def _dspark_rank(rank, world, store, result):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from dflash.step import ranks_sum
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    target, drafter, ids, mask, valid, anchors = _dspark_setup()
    ddp = DDP(drafter)
    rows = slice(0, 4) if rank == 0 else slice(4, 8)
    _dspark_loss(ddp, target, rows, ids, mask, valid, anchors, ranks_sum).loss.backward()
    if rank == 0:
        torch.save({k: p.grad for k, p in drafter.named_parameters()}, result)
    dist.barrier()
    shutdown_process_group()


def test_dspark_two_ranks_on_a_and_b_equal_one_process_on_both(tmp_path):
    """DSpark's terms are divided by the slot weight of the whole step over every rank;
    its heads sit outside the DDP-wrapped forward and still get the averaged gradients."""
    result = tmp_path / "dspark.pt"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mp.spawn(_dspark_rank, args=(2, str(tmp_path / "store-dspark"), str(result)), nprocs=2)
        target, drafter, ids, mask, valid, anchors = _dspark_setup()
        _dspark_loss(drafter, target, slice(0, 8), ids, mask, valid, anchors).loss.backward()
    finally:
        torch.set_num_threads(threads)
    ranks = torch.load(result)
    grads = {k: p.grad for k, p in drafter.named_parameters()}
    assert {"markov_head.markov_w1.weight", "confidence_head.proj.weight"} <= set(grads)
    for k, g in grads.items():
        assert g is not None, k
        torch.testing.assert_close(ranks[k], g, rtol=1e-4, atol=1e-7)
