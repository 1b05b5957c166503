"""Serve a dflash drafter in llama.cpp and compare its decoding with dflash's own.

    python benchmarks/llama_cpp_check.py --llama-cpp DIR [--workdir W] [--drafter D]

DIR: a llama.cpp source tree with DFlash support and `llama-server` built (`cmake -B
build && cmake --build build --target llama-server`; e.g. the tree vendored in the
`llama-cpp-python` sdist), its converter's Python needs installed (sentencepiece, ...).
W: `make train-real`'s workdir, whose eval.json holds the held-out prompts and the
tokens dflash decoded (`make train-real ARGS=llama_cpp=DIR` runs the same check as its
last stage). See dflash/recipe/llama_cpp.py.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    from dflash.recipe.llama_cpp import check, format_check, llama_cpp_tree
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", required=True)
    ap.add_argument("--workdir", type=Path, default=REPO / ".cache/dflash/end_to_end/smollm2")
    ap.add_argument("--drafter", type=Path, help="default: the drafter eval.json names")
    ap.add_argument("--target", type=Path, default=REPO / ".cache/dflash/smollm2-135m-instruct")
    ap.add_argument("--json")
    args = ap.parse_args()
    from dflash.eval.report import EvalReport
    report = EvalReport.from_json(json.loads((args.workdir / "eval.json").read_text()))
    result = check(llama_cpp_tree(args.llama_cpp, "--llama-cpp"), args.target,
                   args.drafter or Path(report.drafter), report, args.workdir / "gguf")
    print(format_check(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_json(), indent=2))


if __name__ == "__main__":
    main()
