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
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dflash.errors import ConfigError
from dflash.model.target import Target, _set_attention


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def check_tp(path: str | Path, tp: int) -> None:
    """Refuse, naming the key, a target that cannot be split `tp` ways."""
    from transformers import AutoConfig
    if importlib.util.find_spec("accelerate") is None:
        raise ConfigError("topology.target_tp needs the accelerate package: "
                          "pip install -e '.[tp]' (or pip install accelerate)")
    hc = AutoConfig.from_pretrained(str(path), local_files_only=True)
    text = hc.get_text_config() if hasattr(hc, "get_text_config") else hc
    if not getattr(text, "base_model_tp_plan", None):
        raise ConfigError(f"topology.target_tp={tp}: {type(text).__name__} "
                          f"({path}) has no tensor-parallel plan in transformers")
    for key in ("num_attention_heads", "num_key_value_heads"):
        n = getattr(text, key, None)
        if n is not None and int(n) % tp:
            raise ConfigError(f"topology.target_tp={tp} does not divide the target's "
                              f"{key}={n} (model.target.path={path})")


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
        check_tp(cfg.path, mesh.size())
        lm = AutoModelForCausalLM.from_pretrained(str(cfg.path), dtype=getattr(torch, cfg.dtype),
                                                  local_files_only=True, tp_plan="auto",
                                                  device_mesh=mesh)
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
