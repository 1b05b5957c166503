"""A local HF model directory's config.json as transformers reads it, or one line naming
the key and the directory where it cannot be read (no file, not JSON, no model_type,
a model type this transformers does not know)."""
from __future__ import annotations

from pathlib import Path

from dflash.errors import DataError, one_line


def hf_config(path, key: str = "model.target.path", files: str = "a local HF model directory"):
    from transformers import AutoConfig

    path = Path(path)
    if not (path / "config.json").exists():
        raise DataError(f"{key}={path}: no config.json there (expected {files})")
    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (ValueError, OSError, KeyError) as exc:  # transformers' refusals of the file
        said = one_line(exc) or type(exc).__name__
        raise DataError(f"{key}={path}: its config.json cannot be read by transformers: "
                        f"{said}") from None
