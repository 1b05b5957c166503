"""Generate the configuration reference from dflash's schemas (the apps' in dflash/config.py,
each section's beside its code) at build
time (mkdocs-gen-files), so it cannot drift from the code: every key of every app, its
type, its default, and what the schema's comments say of it."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

from dflash import config

APPS = {"train": config.TrainConfig, "plan": config.PlanConfig, "profile": config.ProfileConfig,
        "buckets": config.BucketsAppConfig, "regenerate": config.RegenerateConfig,
        "eval": config.EvalAppConfig, "end_to_end": config.EndToEndConfig}


def field_comments(cls) -> dict[str, str]:
    """Each field's comment: the comment lines just above it and its trailing comment."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        src = inspect.getsource(klass).splitlines()
        tree = ast.parse("\n".join(src).strip() if src[0].startswith(" ") else "\n".join(src))
        body = tree.body[0].body
        group, prev_line = [], -2
        for node in body:
            if not isinstance(node, ast.AnnAssign):
                continue
            name, line = node.target.id, node.lineno - 1
            above = []
            j = line - 1
            while j >= 0 and src[j].strip().startswith("#"):
                above.insert(0, src[j].strip().lstrip("#").strip())
                j -= 1
            if above:
                group = above
            elif line != prev_line + 1:  # a blank line ends a comment's group of keys
                group = []
            prev_line = line
            text = src[line]
            trailing = text.split("#", 1)[1].strip() if "#" in text.split("=", 1)[-1] else ""
            # a key under a comment block shares it until a blank line or the next block
            out[name] = " ".join((above or ([] if trailing else group)) + ([trailing] if trailing else []))
    return out


def type_name(tp) -> str:
    if isinstance(tp, str):
        return tp
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{type_name(args[0])} or null"
    if origin in (list, typing.List):
        return f"list[{type_name(typing.get_args(tp)[0])}]"
    if origin in (dict, typing.Dict):
        return "dict"
    if isinstance(tp, type) and issubclass(tp, __import__("enum").Enum):
        return " | ".join(m.name for m in tp)
    return getattr(tp, "__name__", str(tp))


def rows(cls, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    notes = field_comments(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            yield from rows(tp, f"{key}.")
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "(required)"
        default = getattr(default, "name", default)
        meaning = notes.get(f.name, "").replace("|", "\\|")
        kind = type_name(tp).replace("|", "\\|")
        yield f"| `{key}` | {kind} | `{default}` | {meaning} |"


def page() -> str:
    lines = ["# Configuration reference", "",
             "Generated from the schemas (the apps' in `dflash/config.py`, each section's beside "
             "the code that reads it) when the site is built: every "
             "key each app accepts as `key=value`, its type, its schema default (an app's "
             "YAML defaults and the group presets override some; `python -m dflash.train "
             "--cfg job` prints a composed config) and what the schema says of it.", ""]
    for app, cls in APPS.items():
        lines += [f"## `python -m dflash.{app}`", "", "| key | type | default | meaning |",
                  "| --- | --- | --- | --- |", *rows(cls), ""]
    return "\n".join(lines)


try:
    import mkdocs_gen_files
    with mkdocs_gen_files.open("reference/config.md", "w") as fh:
        fh.write(page())
except ImportError:  # run directly: print it
    if __name__ == "__main__":
        print(page())
