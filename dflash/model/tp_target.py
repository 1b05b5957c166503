"""A target sharded over a tensor-parallel group by transformers' own TP plan.

`topology.target_tp=k` loads the target with `tp_plan="auto"` on the "tp" dimension of
a (dp, tp) device mesh: each of the k ranks of a group holds 1/k of every attention and
MLP projection (DTensor; transformers' plan, no hand-written collectives), and the
residual stream, so every tapped layer's output, comes out replicated on all k ranks.

The drafter side keeps one replica per rank (all in one DDP group, as without TP): each
rank still has its own batch from the plan. The group's target runs once over the k
ranks' batches together (gathered, padded on the right to the widest: causal attention
never lets a real token see the padding), and each rank keeps its own rows. So the
plan, the loss normaliser and the step count are those of a run without TP on the
same global batches, and no rank idles while another trains.

Each rank also keeps plain copies of the embedding and the LM head, which the drafter
reads (its noise embedding and its loss): V x H each, e.g. 1.2 GiB in bf16 for Qwen3-8B.
"""
from __future__ import annotations

import importlib.util
import math
import os
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dflash.errors import ConfigError
from dflash.model.hf_config import hf_config
from dflash.model.target import Target, _set_attention


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


# The transformers releases this module's patches (a bound method, a private dict, a
# private function, a module function swapped during load) were tested against
TESTED_TRANSFORMERS = ("5.0", "5.25")


def check_transformers_version(version: str | None = None) -> None:
    """A sharded load patches transformers internals: refuse a release outside the
    tested ones in one line instead of failing somewhere inside a load."""
    import transformers
    version = version or transformers.__version__
    major_minor = tuple(int(x) for x in version.split(".")[:2])
    lo, hi = (tuple(int(x) for x in v.split(".")) for v in TESTED_TRANSFORMERS)
    if not lo <= major_minor <= hi:
        raise ConfigError(f"topology.target_tp needs transformers {TESTED_TRANSFORMERS[0]} to "
                          f"{TESTED_TRANSFORMERS[1]} (tested; it patches internals), this is "
                          f"{version}: pip install 'transformers>={TESTED_TRANSFORMERS[0]},"
                          f"<={TESTED_TRANSFORMERS[1]}.99'")


def check_tp(path: str | Path, tp: int) -> None:
    """Refuse, naming the key, a target that cannot be split `tp` ways."""
    check_transformers_version()
    if importlib.util.find_spec("accelerate") is None:
        raise ConfigError("topology.target_tp needs the accelerate package: "
                          "pip install -e '.[tp]' (or pip install accelerate)")
    hc = hf_config(path)
    text = hc.get_text_config() if hasattr(hc, "get_text_config") else hc
    if not getattr(text, "base_model_tp_plan", None):
        raise ConfigError(f"topology.target_tp={tp}: {type(text).__name__} "
                          f"({path}) has no tensor-parallel plan in transformers")
    for key in ("num_attention_heads", "num_key_value_heads"):
        n = getattr(text, key, None)
        if n is not None and int(n) % tp:
            raise ConfigError(f"topology.target_tp={tp} does not divide the target's "
                              f"{key}={n} (model.target.path={path})")


class _GroupMeshes:
    """transformers' mesh manager for several TP groups in one job. transformers 5.x
    derives its TP size as WORLD_SIZE / (the other dims), so with tp < world it shards
    the target over every rank (two groups' batches then meet in one all-reduce); and it
    builds its per-head unit meshes from a group's own ranks, while creating a process
    group is a collective of the whole world (names from a per-process counter: two
    groups creating theirs at once get the same name, and their ranks meet). Here every
    mesh is built over the whole world, group by group, on every rank: (pp, dp_replicate,
    fsdp, tp) = (1, world / tp, 1, tp), a TP group being `tp` consecutive ranks as in
    `dflash.topology`, and the unit meshes as the (world / tp, units, replicas) mesh's
    last two dims."""

    def __init__(self, device_type: str, tp: int):
        from torch.distributed.device_mesh import init_device_mesh
        from transformers.distributed.utils import TransformersDeviceMesh
        world = dist.get_world_size()
        shape = (1, world // tp, 1, tp)
        self.tp, self.world = tp, world
        self.manager = TransformersDeviceMesh(
            init_device_mesh(device_type, shape, mesh_dim_names=("pp", "dp_replicate", "fsdp", "tp")),
            init_device_mesh(device_type, shape, mesh_dim_names=("pp", "dp_replicate", "efsdp", "ep")))
        self.manager.get_unit_mesh = self.unit_mesh

    def unit_mesh(self, unit_number: int):
        from torch.distributed.device_mesh import DeviceMesh
        units = self.manager._unit_meshes
        groups = math.gcd(int(unit_number), self.tp)
        if groups not in units:
            layout = torch.arange(self.world).reshape(self.world // self.tp, groups, self.tp // groups)
            full = DeviceMesh(self.manager.get_mesh("tp").device_type, mesh=layout,
                              mesh_dim_names=("dp", "tp", "unit_replicate"))
            units[groups] = full["tp", "unit_replicate"]
        return units[groups]

    @contextmanager
    def installed(self):
        """transformers' loader takes these meshes instead of building its own."""
        from transformers.distributed import mixin, utils

        def initialize(_config):
            return utils._bind_local_device(self.manager.get_mesh("tp").device_type,
                                            int(os.environ.get("LOCAL_RANK", 0))), self.manager
        saved = mixin.initialize_distributed_mesh
        mixin.initialize_distributed_mesh = initialize
        try:
            yield
        finally:
            mixin.initialize_distributed_mesh = saved


class TensorParallelTarget(Target):
    def __init__(self, lm: nn.Module, layer_ids, group):
        super().__init__(lm, layer_ids)
        self.group = group
        self.tp = dist.get_world_size(group)
        self._embed = nn.Embedding.from_pretrained(_plain(lm.get_input_embeddings().weight).detach(),
                                                   freeze=True)
        self._head = _plain(lm.get_output_embeddings().weight).detach()

    @classmethod
    def load(cls, cfg, mesh) -> "TensorParallelTarget":
        from transformers import AutoModelForCausalLM
        if cfg.path is None:
            raise ConfigError("topology.target_tp > 1 shards a target read from disk: set "
                              "model.target.path (the tiny model is built in memory)")
        from transformers.distributed import DistributedConfig
        tp = mesh.size()
        check_tp(cfg.path, tp)
        meshes = _GroupMeshes(mesh.device_type, tp)
        ours = meshes.manager.get_mesh("tp").mesh.tolist()
        if ours != mesh.mesh.tolist():  # the loader's TP group must be this rank's group
            raise ConfigError(f"topology.target_tp={tp}: transformers' TP group {ours} is not "
                              f"this rank's group {mesh.mesh.tolist()}")
        with meshes.installed():
            lm = AutoModelForCausalLM.from_pretrained(
                str(cfg.path), dtype=getattr(torch, cfg.dtype), local_files_only=True,
                distributed_config=DistributedConfig(tp_plan="auto", tp_size=tp))
        lm = _set_attention(lm, cfg.attn_implementation)
        return cls(lm, list(cfg.layer_ids) if cfg.layer_ids else None, mesh.get_group())

    def to(self, *args, **kwargs):  # the shards sit where the mesh put them
        self._embed = self._embed.to(*args, **kwargs)
        self._head = self._head.to(*args, **kwargs)
        return self

    @property
    def vocab_size(self) -> int:
        return self._head.shape[0]

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self._embed

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self._head

    def _gather(self, t: torch.Tensor) -> list:
        out = [torch.empty_like(t) for _ in range(self.tp)]
        dist.all_gather(out, t.contiguous(), group=self.group)
        return out

    @torch.no_grad()
    def context(self, input_ids, attention_mask=None, position_ids=None, final: bool = False):
        """Target.context over the group's batches together; this rank's rows back."""
        b, s = input_ids.shape
        dev = input_ids.device
        shapes = self._gather(torch.tensor([b, s], device=dev))
        bm, sm = (int(max(int(x[i]) for x in shapes)) for i in (0, 1))

        def pad(t, fill):
            out = torch.full((bm, sm), fill, dtype=t.dtype, device=dev)
            out[:t.shape[0], :t.shape[1]] = t
            return torch.cat(self._gather(out))

        ids = pad(input_ids, 0)
        mask = None if attention_mask is None else pad(attention_mask, 0)
        pos = None
        if position_ids is not None:  # the padding continues each row's positions
            tail = position_ids[:, -1:] + 1 + torch.arange(sm - s, device=dev)
            pos = pad(torch.cat([position_ids, tail.expand(b, -1)], 1) if sm > s
                      else position_ids, 0)
        ctx = super().context(ids, mask, pos, final=final)
        r = dist.get_rank(self.group)
        return ctx[r * bm:r * bm + b, :s]
