"""Drafter checkpoints in the public DFlash layout, loadable by serving engines.

    DIR/config.json        Qwen3 config, architectures ["DFlashDraftModel"], top-level
                           block_size and num_target_layers, and
                           dflash_config {block_size, mask_token_id, target_layer_ids,
                           causal}; layer_types, sliding_window and is_causal explicit
    DIR/model.safetensors  fc.weight, hidden_norm.weight, norm.weight, layers.{i}.* (no
                           embeddings or LM head: those are the target's)

`sample_from_anchor` (the block layout) is always written: engines default it by config
style. A DSpark drafter (a Markov head) is `DSparkDraftModel` with `markov_head_type:
vanilla`, `markov_rank`, `confidence_head` and the tensors `markov_head.markov_w1/w2.weight`
(W2 over the whole vocabulary here, zero on ids a draft vocabulary left out) and
`confidence_head.proj.weight/bias`. An anchor-first drafter without a Markov head is
exported with a zero rank-1 one (`markov_head_placeholder`): llama.cpp detects DSpark by
`markov_w1` and would otherwise read an anchor-first block one slot late.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dflash.errors import ConfigError, DataError
from dflash.model.draft_head import pop_draft_head
from dflash.model.drafter import FULL, SLIDING, DFlashDrafter, DrafterSpec, check_layout


# each dtype under both spellings the config uses elsewhere (model.autocast=bf16)
EXPORT_DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16")
_DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32,
                "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def export_dtype(name: str, device) -> torch.dtype:
    """checkpoint.dtype: auto is bfloat16 for a drafter trained on CUDA, else float32."""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return _DTYPE_NAMES[name]


def drafter_config_dict(spec: DrafterSpec) -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "rms_norm_eps": spec.rms_norm_eps,
        # both spellings of rope: transformers < 5 reads rope_theta, 5 rope_parameters
        "rope_theta": spec.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "max_position_embeddings": spec.max_position_embeddings,
        "hidden_act": "silu",
        "attention_bias": spec.attention_bias,
        # every layer's kind, and causality, written explicitly: readers' defaults differ
        # (one takes sliding layers as causal unless is_causal says otherwise)
        "layer_types": list(spec.layer_types or [FULL] * spec.num_layers),
        "use_sliding_window": SLIDING in spec.layer_types,
        "sliding_window": spec.sliding_window,
        "max_window_layers": spec.num_layers,
        "is_causal": spec.causal,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        # older readers take block_size from the top level, newer ones from dflash_config
        "block_size": spec.block_size,
        "num_target_layers": spec.num_target_layers,
        "dflash_config": {"block_size": spec.block_size, "mask_token_id": spec.mask_token_id,
                          "target_layer_ids": list(spec.target_layer_ids),
                          "causal": spec.causal},
        "sample_from_anchor": spec.sample_from_anchor,
        **dspark_keys(spec),
    }


def dspark_keys(spec: DrafterSpec) -> dict:
    """The DSpark config keys (none for a plain DFlash drafter in the z-lab layout)."""
    if not spec.markov_rank and not spec.sample_from_anchor:
        return {}
    placeholder = not spec.markov_rank
    return {"architectures": ["DSparkDraftModel"], "markov_head_type": "vanilla",
            "markov_rank": spec.markov_rank or 1, "confidence_head": spec.confidence_head,
            "markov_head_placeholder": placeholder}


def dspark_state(drafter: DFlashDrafter) -> dict:
    """The Markov head's tensors as exported: W2 over the whole vocabulary (a draft
    vocabulary's rows scattered, zero elsewhere), or the zero placeholder head."""
    spec, mh = drafter.spec, drafter.markov_head
    if mh is None:
        if not spec.sample_from_anchor:
            return {}
        dtype = drafter.fc.weight.dtype
        return {"markov_head.markov_w1.weight": torch.zeros(spec.vocab_size, 1, dtype=dtype),
                "markov_head.markov_w2.weight": torch.zeros(spec.vocab_size, 1, dtype=dtype)}
    w2 = mh.markov_w2.weight.detach()
    if mh.ids is not None:
        full = w2.new_zeros(spec.vocab_size, w2.shape[1])
        full[mh.ids.to(w2.device)] = w2
        w2 = full
    return {"markov_head.markov_w2.weight": w2}


def save_drafter(drafter: DFlashDrafter, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = drafter_config_dict(drafter.spec)
    state = {**drafter.state_dict(), **dspark_state(drafter)}
    state = {k: v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in state.items()}
    # transformers < 5 reads torch_dtype, 5 reads dtype: both say what the file holds
    cfg["torch_dtype"] = cfg["dtype"] = str(next(iter(state.values())).dtype).replace("torch.", "")
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    misread = misread_by(drafter.spec)
    if misread:
        logging.getLogger("dflash.export").warning("%s: %s", path, misread)
    return path


def misread_by(spec: DrafterSpec) -> str | None:
    """One line where a public reader is known to read this layout otherwise than it was
    trained (docs/serving.md; tests/unit/test_readers.py), else None."""
    what = [w for w, on in (("causal blocks", spec.causal),
                            ("sliding-window layers", SLIDING in (spec.layer_types or []))) if on]
    if not what:
        return None
    return (f"{' and '.join(what)}: SpecForge 0.2.0 reads every DFlash drafter bidirectionally "
            "and, under sdpa/eager attention, without windows; serve it where is_causal and "
            "layer_types are honoured (the z-lab reader; llama.cpp's runtime reads both)")


def _rope_theta(cfg: dict, where: str) -> float:
    """rope theta from `rope_parameters` (transformers 5) or `rope_theta`; only plain
    rope is what the drafter computes, so a scaled variant is refused, not ignored."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise DataError(f"{where}: rope_type {kind!r} is not supported by dflash's drafter "
                        "(plain rope only); refusing to load it as plain rope")
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    return float(theta) if theta is not None else 1_000_000.0


def _layout(cfg: dict, where: str) -> dict:
    """layer_types, sliding_window and causal as the public reference reader takes them:
    layer_types (else use_sliding_window + max_window_layers, else all full), and
    causality from dflash_config.causal, else is_causal, else its default (sliding
    layers causal, full ones not), refused when that default would mix the two."""
    n = int(cfg["num_hidden_layers"])
    kinds = cfg.get("layer_types")
    if not kinds:
        first = int(cfg.get("max_window_layers") or 0) if cfg.get("use_sliding_window") else n
        kinds = [FULL if i < first else SLIDING for i in range(n)]
    window = cfg.get("sliding_window") if SLIDING in kinds else None
    causal = cfg.get("dflash_config", {}).get("causal", cfg.get("is_causal"))
    if causal is None:
        if SLIDING in kinds and FULL in kinds:
            raise DataError(f"{where}: is_causal is not set and the layers mix sliding (causal "
                            "by the reference reader's default) and full (bidirectional); "
                            "dflash trains one in-block causality for every layer: set "
                            "is_causal to what the drafter was trained with")
        causal = SLIDING in kinds
    try:
        check_layout(n, kinds, window, prefix="")
    except ConfigError as exc:
        raise DataError(f"{where}: {exc}") from None
    return {"layer_types": list(kinds), "sliding_window": None if window is None else int(window),
            "causal": bool(causal)}


def _check_unsupported(cfg: dict, where: str) -> None:
    """Keys a public reader honours that dflash's drafter does not compute: loading
    them anyway would run a different model under the same weights."""
    dc = cfg.get("dflash_config", {})
    taps, n = dc.get("target_layer_ids"), cfg.get("num_target_layers")
    if taps is not None and n is not None and int(n) - 1 in [int(i) for i in taps]:
        raise DataError(f"{where}: dflash_config.target_layer_ids={list(taps)} taps layer "
                        f"{int(n) - 1}, the target's last (engines read it before the final "
                        "norm, converters drop it); this drafter cannot be served as trained")


def _dspark_spec(cfg: dict) -> dict:
    """The heads and layout a config states. sample_from_anchor absent: false for a
    DFlash config, true for a DSpark one (llama.cpp's converter default)."""
    dspark = "DSparkDraftModel" in cfg.get("architectures", [])
    rank = 0 if cfg.get("markov_head_placeholder") else int(cfg.get("markov_rank", 0) or 0)
    n, vocab = cfg.get("draft_vocab_size"), int(cfg["vocab_size"])
    return {"markov_rank": rank, "confidence_head": bool(cfg.get("confidence_head", False)),
            "sample_from_anchor": bool(cfg.get("sample_from_anchor", dspark)),
            "draft_rows": int(n) if rank and n is not None and int(n) < vocab else None}


def spec_from_config(cfg: dict, where: str) -> DrafterSpec:
    _check_unsupported(cfg, where)
    try:
        dc = cfg.get("dflash_config", {})
        layout = _layout(cfg, where)
        return DrafterSpec(
            hidden_size=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"], num_kv_heads=cfg["num_key_value_heads"],
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
            num_target_layers=cfg["num_target_layers"],
            target_layer_ids=list(dc["target_layer_ids"]),
            block_size=int(dc.get("block_size", cfg.get("block_size", 16))),
            mask_token_id=int(dc["mask_token_id"]), rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(cfg, where),
            max_position_embeddings=cfg.get("max_position_embeddings", 40960),
            attention_bias=bool(cfg.get("attention_bias", False)), **layout,
            **_dspark_spec(cfg))
    except KeyError as exc:
        raise DataError(f"{where}: missing key {exc} for a DFlash drafter") from exc


# what a drafter must share with the run it is loaded into (warm start), each with the
# key a user would change to make them agree
MUST_MATCH = {"hidden_size": "the target's hidden size",
              "num_layers": "model.drafter.num_layers",
              "block_size": "model.drafter.block_size",
              "target_layer_ids": "model.target.layer_ids",
              "num_target_layers": "the target's layer count",
              "mask_token_id": "model.drafter.mask_token_id",
              "vocab_size": "the target's vocabulary",
              "num_heads": "the target's attention heads",
              "num_kv_heads": "the target's KV heads",
              "head_dim": "the target's head_dim",
              "intermediate_size": "the target's intermediate size",
              "layer_types": "model.drafter.layer_types",
              "sliding_window": "model.drafter.sliding_window",
              "causal": "model.drafter.causal",
              "markov_rank": "model.drafter.markov_rank",
              "confidence_head": "model.drafter.confidence_head",
              "sample_from_anchor": "model.drafter.sample_from_anchor"}


def check_compatible(loaded: DrafterSpec, want: DrafterSpec, where: str) -> None:
    """Refuse a drafter whose shape or serving contract differs from the run's, naming
    the first differing field (its weights would not fit, or would mean something else)."""
    for name, key in MUST_MATCH.items():
        a, b = getattr(loaded, name), getattr(want, name)
        if (list(a) if isinstance(a, (list, tuple)) else a) != \
                (list(b) if isinstance(b, (list, tuple)) else b):
            raise DataError(f"{where}: {name} is {a} there but {b} in this run ({key}); "
                            "a warm start needs the same drafter shape and serving contract")


def drafter_config(path: str | Path) -> dict:
    """A drafter checkpoint's config.json, with its weights file's header read: what an
    app checks before it loads a target (minutes on a large one) to find the drafter bad."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"drafter checkpoint {path}: no such directory")
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    for f in (cfg_file, weights):
        if not f.exists():
            raise DataError(f"drafter checkpoint {path}: {f.name} is missing")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{cfg_file} is corrupt: {exc}") from exc
    if not isinstance(cfg, dict) or not {"DFlashDraftModel", "DSparkDraftModel"} & set(
            cfg.get("architectures") or []):
        got = cfg.get("architectures") if isinstance(cfg, dict) else cfg
        raise DataError(f"{cfg_file}: architectures {got} is not a DFlash drafter")
    try:
        from safetensors import safe_open
        with safe_open(str(weights), framework="pt") as f:
            f.keys()
    except Exception as exc:  # noqa: BLE001  (safetensors raises its own and OS errors)
        raise DataError(f"{weights} is corrupt: {exc}") from None
    return cfg


def load_drafter(path: str | Path, device="cpu") -> DFlashDrafter:
    path = Path(path)
    cfg = drafter_config(path)
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    drafter = DFlashDrafter(spec_from_config(cfg, str(cfg_file)))
    try:
        state = load_file(str(weights), device=str(device))
    except Exception as exc:
        raise DataError(f"{weights} is corrupt: {exc}") from exc
    head = pop_draft_head(cfg, state, str(path))  # a reduced draft head, where exported
    if cfg.get("markov_head_placeholder"):  # the zero head written for llama.cpp's sake
        state.pop("markov_head.markov_w1.weight", None)
        state.pop("markov_head.markov_w2.weight", None)
    try:
        missing, unexpected = drafter.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a tensor of another shape than the config states
        first = str(exc).splitlines()[1].strip() if "\n" in str(exc) else str(exc)
        raise DataError(f"{weights} does not match its config.json: {first}") from None
    if missing or unexpected:
        raise DataError(f"{weights}: missing {sorted(missing)[:5]}, unexpected "
                        f"{sorted(unexpected)[:5]} parameter names")
    drafter.draft_head = None if head is None else head.to(device)
    if drafter.markov_head is not None and drafter.spec.draft_rows is not None:
        drafter.markov_head.ids = head.ids  # W2's rows: the draft head's ids
    return drafter.to(device)
