"""The frozen target: any HF causal LM, returning hidden states at a few layers.

Hidden states are captured by forward hooks on the needed decoder layers, and a hook on
the last needed layer stops the forward there: later layers and the LM head (a 150K x
4K matmul per token at 8B scale) never run during training, and no other layer's output
is kept. Works for any HF decoder whose base model exposes `.layers`.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dflash.errors import ConfigError, DataError
from dflash.model.hf_config import hf_config


class _StopForward(Exception):
    pass


def default_layer_ids(num_layers: int, count: int = 5) -> list[int]:
    """`count` layers spread evenly from layer 1 to L-3 (Qwen3-8B: [1, 9, 17, 25, 33])."""
    # never the last layer (see check_not_last_layer); tiny targets fall back to L-2
    last = num_layers - 3 if num_layers > 3 else max(0, num_layers - 2)
    first = min(1, last)
    count = max(1, min(count, last - first + 1))
    return sorted({int(round(x)) for x in np.linspace(first, last, count)})


def check_not_last_layer(layer_ids, num_layers: int, key: str) -> None:
    """The last layer is not a tap a drafter can be served with: HF's
    `output_hidden_states` gives it after the final norm, serving engines capture layer
    outputs inside their layer loop (before it), and a public converter drops the last
    layer from the taps, so the drafter would be trained on one thing and served another."""
    if num_layers - 1 in [int(i) for i in layer_ids]:
        raise ConfigError(
            f"{key}={list(layer_ids)} taps layer {num_layers - 1}, the target's last: serving "
            "engines read it before the final norm and converters drop it, so a drafter "
            f"trained on it is served something else; tap layers 0..{num_layers - 2} (the "
            f"public drafters tap 1..L-3, here up to {max(1, num_layers - 3)})")


def tiny_qwen3_config(cfg):
    """The in-memory target's HF config from the model.target keys."""
    from transformers import Qwen3Config

    unset = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                         "num_key_value_heads", "intermediate_size", "vocab_size")
             if cfg.get(k) is None]
    if unset:
        raise ConfigError(f"model.target.path is not set, so a tiny model is built, but "
                          f"model.target.{unset[0]} is null (model=hf needs "
                          "model.target.path=DIR or DFLASH_TARGET_PATH)")

    hc = Qwen3Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                     intermediate_size=cfg.intermediate_size,
                     num_hidden_layers=cfg.num_hidden_layers,
                     num_attention_heads=cfg.num_attention_heads,
                     num_key_value_heads=cfg.num_key_value_heads,
                     head_dim=cfg.hidden_size // cfg.num_attention_heads,
                     max_position_embeddings=8192, tie_word_embeddings=False)
    return hc


def checked_layer_ids(layer_ids, n: int) -> list[int]:
    """`model.target.layer_ids` (None: the default spread) checked against n layers."""
    ids = list(layer_ids) if layer_ids else default_layer_ids(n)
    bad = [i for i in ids if not 0 <= int(i) < n]
    if bad:
        raise ConfigError(f"model.target.layer_ids {bad} outside the target's {n} layers")
    check_not_last_layer(ids, n, "model.target.layer_ids")
    return ids


def build_tiny_qwen3(cfg) -> nn.Module:
    from transformers import Qwen3ForCausalLM

    hc = tiny_qwen3_config(cfg)
    dev = torch.device(getattr(cfg, "build_device", "cpu") or "cpu")
    dtype = getattr(torch, getattr(cfg, "dtype", "float32"))
    with torch.random.fork_rng(devices=[]), torch.device(dev):
        torch.manual_seed(cfg.seed)
        if dev.type == "cuda":
            torch.cuda.manual_seed(cfg.seed)
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype if dev.type != "cpu" else old)
        try:
            lm = Qwen3ForCausalLM(hc)
        finally:
            torch.set_default_dtype(old)
    return _set_attention(lm, getattr(cfg, "attn_implementation", None) or "sdpa")


def _set_attention(lm: nn.Module, name: str | None) -> nn.Module:
    """Switch the HF attention kernel, naming the config key when HF refuses it (an
    unknown name, or a kernel whose package is not installed)."""
    if name is None:
        return lm
    try:
        lm.set_attn_implementation(name)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"model.target.attn_implementation={name!r}: {exc}") from exc
    return lm


def load_causal_lm(path: str | Path, dtype: torch.dtype,
                   attn_implementation: str | None = None,
                   key: str = "model.target.path") -> nn.Module:
    from transformers import AutoModelForCausalLM

    path = Path(path)
    config = hf_config(path, key)
    try:
        lm = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype,
                                                  local_files_only=True)
    except ValueError as exc:
        raise DataError(f"{key}={path}: {type(config).__name__} is not a causal "
                        f"LM ({exc})") from exc
    return _set_attention(lm, attn_implementation)


def target_sizes(cfg) -> dict:
    """The target's hidden size, layer count and vocabulary from its config alone (no
    weights loaded): the tiny model's keys, or a local model's config.json."""
    if cfg.path is None:
        return {"hidden_size": int(cfg.hidden_size), "num_layers": int(cfg.num_hidden_layers),
                "vocab_size": int(cfg.vocab_size)}
    hc = hf_config(cfg.path)
    text = hc.get_text_config() if hasattr(hc, "get_text_config") else hc
    return {"hidden_size": int(text.hidden_size), "num_layers": int(text.num_hidden_layers),
            "vocab_size": int(getattr(hc, "vocab_size", None) or text.vocab_size)}


def target_vocab_size(cfg) -> int:
    """The target's vocabulary from its config alone (no weights loaded)."""
    return target_sizes(cfg)["vocab_size"]


class Target(nn.Module):
    def __init__(self, lm: nn.Module, layer_ids: list[int] | None = None):
        super().__init__()
        self.lm = lm.eval().requires_grad_(False)
        self.config = lm.config
        self.base = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.model
        self.layer_ids = checked_layer_ids(layer_ids, len(self.base.layers))

    @classmethod
    def from_config(cls, cfg) -> "Target":
        dtype = getattr(torch, cfg.dtype)
        lm = (build_tiny_qwen3(cfg).to(dtype) if cfg.path is None
              else load_causal_lm(cfg.path, dtype, cfg.attn_implementation))
        return cls(lm, list(cfg.layer_ids) if cfg.layer_ids else None)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.lm.get_output_embeddings().weight.shape[0]

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.lm.get_input_embeddings()

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.lm.get_output_embeddings().weight

    def _capture_hook(self, i: int):
        def hook(_module, _inputs, output):
            st = getattr(self._tls, "state", None)
            if st is None:  # another thread's forward, or no capture running
                return
            captured, stop_early, last = st
            captured[i] = output[0] if isinstance(output, tuple) else output
            if stop_early and i == last:
                raise _StopForward
        return hook

    def _run_capturing(self, forward, stop_early: bool):
        """Run `forward()` keeping only the chosen layers' outputs; with `stop_early` the
        forward is cut after the last chosen layer. The hooks are registered once and
        read a thread-local state, so the pipeline's target thread and an evaluation on
        the main thread can share the model (registering hooks per call from two
        threads would race on the hook dict)."""
        if getattr(self, "_hooked", None) != self.layer_ids:  # first use, or ids changed
            for h in getattr(self, "_hooks", []):
                h.remove()
            self._tls = getattr(self, "_tls", None) or threading.local()
            self._hooks = [self.base.layers[i].register_forward_hook(self._capture_hook(i))
                           for i in self.layer_ids]
            self._hooked = list(self.layer_ids)
        captured: dict[int, torch.Tensor] = {}
        self._tls.state = (captured, stop_early, max(self.layer_ids))
        result = None
        try:
            result = forward()
        except _StopForward:
            pass
        finally:
            self._tls.state = None
        return result, torch.cat([captured[i] for i in self.layer_ids], dim=-1)

    @torch.no_grad()
    def context(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, final: bool = False) -> torch.Tensor:
        """[B, S, len(layer_ids) * H]: the outputs of the chosen layers, concatenated.
        `position_ids` restarting at 0 (without an attention mask) mark packed documents:
        no token attends across a restart. `final`: run every layer and append the final
        normed hidden state ([B, S, (len(layer_ids) + 1) * H]; what the LM head reads,
        for distillation); otherwise the forward stops after the last chosen layer."""
        out, ctx = self._run_capturing(
            lambda: self.base(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, use_cache=False), stop_early=not final)
        return torch.cat([ctx, out.last_hidden_state], dim=-1) if final else ctx

    @torch.no_grad()
    def logits_and_context(self, input_ids: torch.Tensor):
        """Full forward (for verification): last-layer logits and the drafter context."""
        out, ctx = self._run_capturing(
            lambda: self.lm(input_ids=input_ids, use_cache=False), stop_early=False)
        return out.logits, ctx
