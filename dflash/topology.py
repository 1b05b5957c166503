"""Where this process runs: rank, world size and device, from torchrun's env + config.

One process per (target device, drafter device) pair; with several processes the
drafter replicas are kept in sync by DistributedDataParallel (NCCL on GPU, gloo on
CPU). The frozen target is never wrapped.
"""
from __future__ import annotations

import atexit
import os
import time
from dataclasses import dataclass, field
from typing import List

import torch

from dflash.options import choice, options
from dflash.errors import TopologyError


@dataclass
class Topology:
    rank: int
    world_size: int
    local_rank: int
    target_device: torch.device
    drafter_device: torch.device
    tp_size: int = 1  # ranks one target replica spans (topology.target_tp)
    tp_mesh: object = None  # their DeviceMesh, when tp_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


DEVICES = ("auto", "cpu", "cuda")


def resolve_device(kind: str) -> torch.device:
    if kind == "cuda" or (kind == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise TopologyError("topology.device=cuda but no CUDA device is visible "
                            "(use topology=cpu)")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


def pair_devices(cfg, local: int, local_world: int, gpus: int) -> tuple[int, int]:
    """GPU indices (target, drafter) of local rank `local`."""
    t, d = list(cfg.target_devices), list(cfg.drafter_devices)
    if len(t) != len(d):
        raise TopologyError(f"topology {cfg.name}: target_devices {t} and drafter_devices {d} "
                        "must list one GPU per pair each")
    if not t:  # a GPU each when the node has enough, else the pair shares one
        return (2 * local, 2 * local + 1) if 2 * local_world <= gpus else (local % gpus,) * 2
    if local >= len(t):
        raise TopologyError(f"topology {cfg.name}: local rank {local} has no pair in "
                        f"target_devices {t} (start at most {len(t)} processes per node)")
    bad = [g for g in (t[local], d[local]) if not 0 <= g < gpus]
    if bad:
        raise TopologyError(f"topology {cfg.name}: GPU {bad[0]} of pair {local} does not exist "
                        f"({gpus} visible)")
    return t[local], d[local]


def export_submitit_env() -> None:
    """Under `hydra/launcher=submitit_slurm` each SLURM task runs the app without torchrun:
    take rank, world size and the rendezvous address from the job's environment."""
    if "WORLD_SIZE" in os.environ or "SUBMITIT_EXECUTOR" not in os.environ:
        return
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError as exc:
        raise TopologyError("a submitit job without torchrun needs submitit "
                        "(pip install -e '.[slurm]')") from exc
    # dflash maps GPUs to ranks itself (a `pairs` task uses two): leave every GPU visible
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def launch_rank() -> int:
    """This process's rank as its launcher set it (torchrun, submitit), readable before
    any process group exists: the apps print and write on rank 0 only."""
    return int(os.environ.get("RANK", 0))


def build_topology(cfg) -> Topology:
    export_submitit_env()
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = launch_rank()
    local = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    check_dp_size(cfg, world)
    if cfg.expandable_segments and choice(cfg.device) != "cpu":
        # before the first CUDA allocation; variable shapes otherwise fragment the cache
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    device = resolve_device(choice(cfg.device))
    if device.type == "cpu" and local_world > 1 and "OMP_NUM_THREADS" not in os.environ:
        # processes sharing a node's cores (submitit tasks; torchrun sets OMP_NUM_THREADS=1)
        # would each start one thread per core, and oversubscribed cores crawl
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    tp = check_target_tp(cfg, world)
    drafter_device = device
    if device.type == "cuda" and tp == 1 and (world > 1 or cfg.target_devices):
        ti, di = pair_devices(cfg, local, local_world, torch.cuda.device_count())
        device, drafter_device = torch.device("cuda", ti), torch.device("cuda", di)
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if drafter_device.type == "cuda" else "gloo"
        if drafter_device.type == "cuda":
            torch.cuda.set_device(drafter_device)
        torch.distributed.init_process_group(backend)
        atexit.register(shutdown_process_group)
    mesh = None
    if tp > 1:  # (dp, tp): a TP group is `tp` consecutive ranks
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))["tp"]
    return Topology(rank, world, local, device, drafter_device, tp, mesh)


def check_dp_size(cfg, world: int) -> None:
    if int(cfg.dp_size) != world:
        raise TopologyError(f"topology {cfg.name} plans for dp_size={cfg.dp_size} data-parallel "
                            f"processes but {world} were started (torchrun --nproc_per_node x "
                            f"nodes); start {cfg.dp_size} or set topology.dp_size={world}")


def check_target_tp(cfg, world: int) -> int:
    """topology.target_tp, refused in one line when the world cannot hold it."""
    tp = int(cfg.target_tp)
    if tp < 1:
        raise TopologyError(f"topology.target_tp={tp}: must be 1 or more")
    if tp > 1 and world == 1:
        raise TopologyError(f"topology.target_tp={tp} shards the target over {tp} processes "
                            f"but this is one process (topology {cfg.name}): start them with "
                            f"torchrun --nproc_per_node={tp} ... topology=pairs")
    if world % tp:
        raise TopologyError(f"topology.target_tp={tp} does not divide the {world} processes "
                            "started (torchrun --nproc_per_node x nodes)")
    if tp > 1 and cfg.target_devices:
        raise TopologyError("topology.target_tp > 1 puts each rank on its own device; "
                            "leave topology.target_devices / drafter_devices empty")
    return tp


# How long the last collectives' worker threads get to let go of their tensors at exit
DRAIN_SECONDS = 0.2


def shutdown_process_group() -> None:
    """Destroy the process group, then give its worker threads a moment, while the
    interpreter is still whole. A gloo worker that has just finished a collective still
    holds its tensors, and freeing a tensor made in Python takes the GIL: once Python is
    finalizing, that aborts the process (SIGABRT, "terminate called without an active
    exception") after a run that succeeded, and torchrun reports the job failed.
    Destroying the group joins those threads only when nothing else holds it, and DDP
    keeps a reference, so the short wait is what covers a training run. Registered with
    atexit: sys.exit and errors take the same path."""
    if not torch.distributed.is_initialized():  # not if the app destroyed it already
        return
    torch.distributed.destroy_process_group()
    time.sleep(DRAIN_SECONDS)


def replica_digests(state_dict: dict, topo) -> list[str]:
    """A digest of the drafter's weights from every rank: DDP replicas must be equal bit
    for bit after the last step, or the run stops here saying so."""
    import hashlib
    h = hashlib.sha256()
    for k, v in sorted(state_dict.items()):
        h.update(k.encode())
        h.update(v.detach().float().cpu().numpy().tobytes())
    mine = h.hexdigest()[:16]
    if not topo.distributed:
        return [mine]
    import torch.distributed as dist
    every = [None] * topo.world_size
    dist.all_gather_object(every, mine)
    if len(set(every)) > 1:
        raise RuntimeError(f"drafter replicas diverged across ranks: {every}")
    return every


# ---- its config section (registered with Hydra by dflash.config) ----

Device = options("Device", DEVICES)


@dataclass
class TopologyConfig:
    name: str = "cpu"  # the topology's name
    device: Device = Device.auto  # auto | cpu | cuda
    # data-parallel replicas; each replica runs target stage(s) then drafter stage(s)
    dp_size: int = 1
    # pairs: per local rank, the GPU index of its target and of its drafter (the same
    # index twice: the pair shares one GPU); empty: a GPU each when there are enough
    target_devices: List[int] = field(default_factory=list)
    drafter_devices: List[int] = field(default_factory=list)
    # the CUDA allocator grows segments instead of fragmenting on variable shapes
    expandable_segments: bool = True
    # > 1: each target replica spans this many consecutive ranks, sharded by
    # transformers' tensor-parallel plan (dflash/model/tp_target.py); every rank keeps
    # its own drafter replica and batch. Under torchrun only; must divide the world
    target_tp: int = 1
