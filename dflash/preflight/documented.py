"""The commands a user copies from the docs: every `python -m dflash...`, `torchrun` and
`make train...` line in README.md and docs/*.md code blocks (backslash continuations
joined), each with the world its text runs it in.

The world: a `# world: 4x8x80` comment in the block sets it for the commands after it;
otherwise a command that names a model (`model.target.path=`) or the production recipe
runs on `--nnodes` nodes of 8 x 80 GB GPUs, and anything else (the CPU demos) on a CPU.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

STARTS = ("python -m dflash", "torchrun ", "make train")
_FENCE = re.compile(r"^\s*```")


@dataclass(frozen=True)
class Documented:
    file: str
    line: int
    text: str
    world: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def _default_world(text: str) -> str:
    if "model.target.path=" not in text and "experiment=production" not in text:
        return "cpu"
    m = re.search(r"(?:--nnodes[= ](?:\d+:)?|hydra\.launcher\.nodes=)(\d+)", text)
    return f"{m[1] if m else 1}x8x80"


def _strip_env(line: str) -> str:
    """`VAR=value python -m ...` counts as a command too."""
    return re.sub(r"^(\s*[A-Za-z_][A-Za-z0-9_]*=\S+\s+)+", "", line)


def commands_in(path: Path, root: Path | None = None) -> list:
    out, in_block, world, pending, start = [], False, None, "", 0
    name = str(path.relative_to(root)) if root else path.name
    for i, raw in enumerate(Path(path).read_text().splitlines(), 1):
        if _FENCE.match(raw):
            in_block, world, pending = not in_block, None, ""
            continue
        if not in_block:
            continue
        line = raw.strip()
        m = re.match(r"#\s*world:\s*(\S+)", line)
        if m:
            world = m[1]
            continue
        if pending:
            pending += " " + line.rstrip("\\").strip()
        elif _strip_env(line).startswith(STARTS):
            pending, start = line.rstrip("\\").strip(), i
        else:
            continue
        if not line.endswith("\\"):
            text = re.sub(r"\s+#.*$", "", pending).strip()
            out.append(Documented(name, start, text, world or _default_world(text)))
            pending = ""
    return out


def documented_commands(root: Path) -> list:
    """Every documented command of the repository at `root`, in reading order."""
    files = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [c for f in files if f.exists() for c in commands_in(f, root)]
