"""The shape of the code, as issue reviews measure it: `python benchmarks/code_shape.py`.

Prints the Trainer class's lines and methods, the longest functions, functions taking more
than 8 parameters, type dispatch (`hasattr` anywhere; `isinstance` against the project's own
classes), and string subscripts on reports (`x["key"]` reads in the report-handling files).
Pure AST reading of `dflash/`; no imports of it.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "dflash"
# the files that build or read reports (where a string subscript is a report read)
REPORT_FILES = ("end_to_end.py", "recipe", "eval/llama_cpp.py", "evaluate.py",
                "comparison/table.py", "train.py", "eval/engine_speed.py")


def modules():
    for path in sorted(ROOT.rglob("*.py")):
        yield path.relative_to(ROOT.parent), ast.parse(path.read_text())


def functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def params(fn) -> int:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return len([n for n in names if n not in ("self", "cls")]) + bool(a.vararg) + bool(a.kwarg)


def own_classes(trees) -> set[str]:
    return {n.name for _, t in trees for n in ast.walk(t) if isinstance(n, ast.ClassDef)}


def main() -> None:
    trees = list(modules())
    classes = own_classes(trees)
    for path, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "Trainer":
                methods = [n for n in node.body if isinstance(n, ast.FunctionDef)]
                print(f"Trainer ({path}): {node.end_lineno - node.lineno + 1} lines, "
                      f"{len(methods)} methods; {path} "
                      f"{len((ROOT.parent / path).read_text().splitlines())} lines")
    fns = [(f.end_lineno - f.lineno + 1, f"{p}:{f.lineno} {f.name}", params(f))
           for p, t in trees for f in functions(t)]
    print("longest functions:", ", ".join(f"{n} ({k})" for k, n, _ in sorted(fns)[::-1][:5]))
    wide = sorted([(k, n) for _, n, k in fns if k > 8], reverse=True)
    print(f"functions over 8 parameters: {len(wide)}",
          ("(" + ", ".join(f"{n} {k}" for k, n in wide) + ")") if wide else "")
    has, isa = [], []
    for p, t in trees:
        for node in ast.walk(t):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in ("hasattr",):
                    has.append(f"{p}:{node.lineno}")
                if node.func.id == "isinstance" and len(node.args) == 2:
                    kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                    if any(isinstance(k, ast.Name) and k.id in classes for k in kinds):
                        isa.append(f"{p}:{node.lineno}")
    print(f"hasattr calls: {len(has)} {has}")
    print(f"isinstance against the project's classes: {len(isa)} {isa}")
    total = 0
    for p, t in trees:
        if not any(str(p).startswith(f"dflash/{r}") for r in REPORT_FILES):
            continue
        n = sum(1 for node in ast.walk(t) if isinstance(node, ast.Subscript)
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
                and isinstance(node.ctx, ast.Load))
        total += n
        print(f"  string subscripts read in {p}: {n}")
    print(f"string subscripts read in report files: {total}")


if __name__ == "__main__":
    sys.exit(main())
