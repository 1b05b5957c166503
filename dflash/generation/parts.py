"""Resumable generation output: one part file per batch, written atomically.

A rerun of the same command reads the manifest (inputs and every setting that changes
what is generated), refuses a different one naming the field, and skips every batch
whose part exists: after a kill -9 only the batches in flight are generated again, and
none twice. A part can hold requests that failed (a server's errors after its retries):
a rerun asks for those again, and only those. The final output is merged from the parts once all exist.
"""
from __future__ import annotations

import json
from pathlib import Path

from dflash.atomic import write_text_atomic
from dflash.errors import DataError


def files_identity(directory, names=("config.json", "model.safetensors",
                                     "tokenizer_config.json", "chat_template.jinja")) -> list:
    """Size and mtime of a model or drafter dir's files that decide what it generates:
    another drafter or chat template under the same path is another manifest."""
    if not directory or not Path(directory).is_dir():
        return []
    return [{"file": n, "bytes": (Path(directory) / n).stat().st_size,
             "mtime_ns": (Path(directory) / n).stat().st_mtime_ns}
            for n in names if (Path(directory) / n).exists()]


def input_identity(paths) -> list:
    out = []
    for p in paths:
        st = Path(p).stat()
        out.append({"path": str(Path(p).resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out


class PartStore:
    def __init__(self, root, manifest: dict):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        m = self.root / "manifest.json"
        if m.exists():
            old = json.loads(m.read_text())
            for k in sorted(set(old) | set(manifest)):
                if old.get(k) != manifest.get(k):
                    raise DataError(f"{self.root}: {k} differs from the run that wrote these parts "
                                    f"({old.get(k)!r} there, {manifest.get(k)!r} now); rerun with "
                                    "the same settings to resume, or write to another out=")
        else:
            write_text_atomic(m, json.dumps(manifest, indent=2))

    def path(self, rnd: int, index: int) -> Path:
        return self.root / f"round-{rnd}" / f"part-{index:06d}.jsonl"

    def done(self, rnd: int, index: int) -> bool:
        return self.path(rnd, index).exists()

    def write(self, rnd: int, index: int, rows: list) -> None:
        write_text_atomic(self.path(rnd, index), "".join(json.dumps(r) + "\n" for r in rows))

    def read_part(self, rnd: int, index: int) -> list:
        return [json.loads(x) for x in self.path(rnd, index).read_text().splitlines()]

    def read_round(self, rnd: int, count: int) -> dict:
        """key -> row over the round's `count` parts (all must exist)."""
        out = {}
        for i in range(count):
            p = self.path(rnd, i)
            if not p.exists():
                raise DataError(f"{p} is missing: a rank has not finished round {rnd}")
            for line in p.read_text().splitlines():
                row = json.loads(line)
                out[row["key"]] = row
        return out


def write_jsonl(path, records) -> Path:
    return write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
