"""Writing a file so that a reader sees the old one or the whole new one, never half:
a temporary file beside it, flushed to disk, then renamed over it."""
from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return path
