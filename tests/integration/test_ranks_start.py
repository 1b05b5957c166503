"""The ranks a test starts with `mp.spawn` (tests/helpers/ranks.py): forked from a
forkserver that already imported transformers, each in a process of its own, and a
rank's failure still reported to the test."""
import os
import sys

import pytest
import torch.multiprocessing as mp


def _where(rank, out):
    # this module imports no transformers: a spawned rank would not have it yet
    (out / str(rank)).write_text(f"{os.getpid()} {'transformers' in sys.modules}")


def _broken(rank):
    if rank == 1:
        raise ValueError("rank one broke")


def test_spawned_ranks_start_imported_in_processes_of_their_own(tmp_path):
    mp.spawn(_where, args=(tmp_path,), nprocs=2)
    got = [(tmp_path / str(r)).read_text().split() for r in range(2)]
    pids = {int(pid) for pid, _ in got}
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(preloaded == "True" for _, preloaded in got), got
    with pytest.raises(Exception, match="rank one broke"):
        mp.spawn(_broken, nprocs=2)
