"""Where this process runs: rank, world size and device, from torchrun's env + config.

One process per (target device, drafter device) pair; with several processes the
drafter replicas are kept in sync by DistributedDataParallel (NCCL on GPU, gloo on
CPU). The frozen target is never wrapped.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .config import choice
from .errors import DataError


@dataclass
class Topology:
    rank: int
    world_size: int
    local_rank: int
    target_device: torch.device
    drafter_device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(kind: str) -> torch.device:
    if kind == "cuda" or (kind == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise DataError("topology.device=cuda but no CUDA device is visible "
                            "(use topology=cpu)")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


def build_topology(cfg) -> Topology:
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = resolve_device(choice(cfg.device))
    drafter_device = device
    if device.type == "cuda" and int(cfg.drafter_gpus) > 0:
        # pairs: local ranks 0..P-1 own GPUs [2r, 2r+1]: target on the first, drafter on the second
        n = torch.cuda.device_count()
        if 2 * (local + 1) > n:
            raise DataError(f"topology {cfg.name}: local rank {local} needs GPUs {2 * local} "
                            f"and {2 * local + 1}, only {n} visible")
        device, drafter_device = torch.device("cuda", 2 * local), torch.device("cuda", 2 * local + 1)
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if drafter_device.type == "cuda" else "gloo"
        if drafter_device.type == "cuda":
            torch.cuda.set_device(drafter_device)
        torch.distributed.init_process_group(backend)
    return Topology(rank, world, local, device, drafter_device)
