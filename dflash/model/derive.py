"""A GPU drafter's depth derived from the target's own config.json (no weights read).

The public DFlash drafters use 5 decoder layers at 8B class. A drafter layer has the
target's width, so its cost grows with the target's: at Llama-3.1-70B's 8,192 x 28,672 a
5-layer drafter is 4.3B parameters, ~64 GiB of weights, gradients and AdamW state
(16 bytes a parameter) before a single activation: it cannot train on an 80 GB GPU. The
depth is the most layers, up to 5, whose training state fits a quarter of an 80 GB
GPU, the rest left to the target's context, the activations and the LM head
(`python -m dflash.preflight` checks the whole step against the world's GPUs):

    Qwen3-8B  5 layers (15.6 GiB)   Qwen3-32B  2 layers (16.5)   Llama-3.1-70B  1 (17.8)
"""
from __future__ import annotations

import json
from pathlib import Path

from dflash.errors import DataError

MAX_LAYERS = 5  # the public drafters' depth at 8B class
STATE_BYTES = 16  # fp32 weight + gradient + AdamW's two moments
STATE_BUDGET_GIB = 20.0  # a quarter of an 80 GB GPU
TAPS = 5  # the context is 5 tapped layers wide (the fc input)


def _text_config(path: Path) -> dict:
    f = path / "config.json"
    if not f.exists():
        raise DataError(f"model.target.path={path}: no config.json there (expected a local "
                        "HF model directory)")
    cfg = json.loads(f.read_text())
    return cfg.get("text_config") or cfg


def _need(cfg: dict, key: str, path: Path) -> int:
    if cfg.get(key) is None:
        raise DataError(f"model.target.path={path}: config.json has no {key}: the drafter's "
                        "depth cannot be derived (set model.drafter.num_layers)")
    return int(cfg[key])


def layer_params(cfg: dict, path: Path) -> tuple[int, int]:
    """(parameters of one drafter layer, of the fc that maps the taps to its width)."""
    h = _need(cfg, "hidden_size", path)
    heads = _need(cfg, "num_attention_heads", path)
    kv = int(cfg.get("num_key_value_heads") or heads)
    hd = int(cfg.get("head_dim") or h // heads)
    inter = _need(cfg, "intermediate_size", path)
    attention = 2 * h * heads * hd + 2 * h * kv * hd  # q, o; k, v
    return attention + 3 * h * inter + 2 * h, TAPS * h * h  # + gate/up/down, two norms


def drafter_layers(path, budget_gib: float = STATE_BUDGET_GIB) -> int:
    """The most layers (1..5) whose training state fits `budget_gib` (1 if even one
    does not: preflight then says what fits)."""
    if path is None or str(path) in ("", "None"):
        return 1  # no target yet: the start refuses the missing path, naming the key
    p = Path(str(path))
    per_layer, fc = layer_params(_text_config(p), p)
    fits = [n for n in range(1, MAX_LAYERS + 1)
            if STATE_BYTES * (fc + n * per_layer) <= budget_gib * 2**30]
    return max(fits, default=1)


def state_gib(path, layers: int) -> float:
    """The training state of a `layers`-deep drafter for the target at `path` (GiB)."""
    p = Path(str(path))
    per_layer, fc = layer_params(_text_config(p), p)
    return STATE_BYTES * (fc + layers * per_layer) / 2**30
