"""Ranks plan independently (no communication) and still agree: real gloo processes."""
import os
import socket

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp


from dflash.batching import PackingSpec, Planner
from dflash.batching.distributed import shard
from dflash.topology import shutdown_process_group


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, remainder, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        lengths = np.random.default_rng(7).integers(1, 3000, 5003)
        planner = Planner("bucketed", lengths, [0, 500, 1500, 3000], PackingSpec(8192, 16), seed=11)
        mine = shard(planner.epoch(3), rank, world, remainder, balance=True, seed=11)
        counts = [None] * world
        dist.all_gather_object(counts, len(mine))
        ids = [None] * world
        dist.all_gather_object(ids, mine.indices.tolist())
        if rank == 0:
            out.put((counts, ids))
        dist.barrier()
    finally:
        shutdown_process_group()  # as dflash's own ranks end: destroy alone can abort at exit


@pytest.mark.parametrize("remainder", ["repeat", "drop"])
def test_ranks_agree_without_talking(remainder):
    world = 3
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.start_processes(_worker, args=(world, _free_port(), remainder, q), nprocs=world,
                       join=True, start_method="spawn")
    counts, ids = q.get(timeout=60)
    assert len(set(counts)) == 1  # the same number of steps on every rank
    flat = [i for r in ids for i in r]
    lengths = np.random.default_rng(7).integers(1, 3000, 5003)
    full = Planner("bucketed", lengths, [0, 500, 1500, 3000], PackingSpec(8192, 16), seed=11).epoch(3)
    if remainder == "repeat":
        assert set(flat) == set(range(5003))
        assert len(flat) - 5003 == sum(len(full[i].sample_ids)
                                       for i in range((-len(full)) % world))
    else:
        assert len(flat) == len(set(flat))
        kept = len(full) - len(full) % world
        assert len(flat) == int(full.offsets[kept])
