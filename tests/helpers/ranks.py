"""Where the ranks a test starts with `torch.multiprocessing.spawn` come from.

A spawned rank is a new interpreter: it imports torch, transformers and dflash again
before its first collective (~4 s of CPU a rank on a 2-core machine; the suite starts
about 20 of them, and a profile of a whole run put over half of its import time there). Ranks forked from a forkserver that
imported those once start at their first line instead. A forkserver is still a clean,
single-threaded process (forking it is safe, unlike forking a pytest worker with its
threads), each rank still runs in a process of its own with real gloo collectives, and
the rank's own environment and arguments reach it as they did."""
from __future__ import annotations

import multiprocessing

# what every rank a test starts imports anyway (an import that fails here is only
# skipped: the rank then imports it itself)
PRELOAD = ["torch", "torch.distributed", "numpy", "omegaconf", "pytest", "transformers",
           "transformers.models.qwen3.modeling_qwen3", "dflash.config", "dflash.trainer",
           "dflash.model.tp_target", "tests.helpers.run"]


def ranks_from_a_forkserver() -> None:
    """Make `torch.multiprocessing.spawn` (which only spawns) start its ranks from a
    forkserver with PRELOAD imported; `start_processes` joins and reports them as
    `spawn` does."""
    import torch.multiprocessing as tmp

    multiprocessing.set_forkserver_preload(PRELOAD)

    def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        return tmp.start_processes(fn, args, nprocs, join, daemon, start_method="forkserver")

    tmp.spawn = spawn
