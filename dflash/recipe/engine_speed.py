"""What a drafter buys in a serving engine: llama-server's greedy decoding speed with each
speculation mode, against no speculation and against the engine's own free n-gram modes.

    python -m dflash.recipe.engine_speed --llama-cpp DIR --target HF_DIR --prompts FILE \
        --drafter NAME=DIR [--drafter NAME=DIR ...] [--concurrency 1 4] [--max-new-tokens 64]

Every mode decodes every prompt (token ids: a dflash eval report's `prompt_ids`, or a
JSONL of {"prompt_ids": [...]}) greedily, one llama-server per mode and concurrency
(`-np` slots); prompts go one at a time at concurrency 1, in groups of N at N. Each
request's tokens/s is the engine's own (`timings.predicted_n / predicted_ms`: decode
only, prompt processing excluded); a mode's figure is total tokens / total decode seconds
over its prompts, its speedup over no speculation a paired 95% bootstrap interval over
the prompts (ratio of sums, as `dflash.eval speed=true`). Acceptance: emitted tokens per
target verify step. Greedy speculation is lossless: every mode's tokens are compared with
no speculation's, prompt by prompt. The n-gram modes are llama.cpp's own
(`--spec-type ngram-simple | ngram-mod | ngram-map-k | ngram-cache`); the best of them by
tokens/s is named.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dflash.errors import DataError, check_file_path, user_errors_exit
from dflash.dirs import cache_root
from dflash.records import to_json
from dflash.recipe.llama_cpp import (_complete, dflash_args, llama_cpp_tree, serving, slot_context,
                                     to_gguf)
from dflash.eval.prompts import load_prompts as jsonl_prompts, prompt_ids
from dflash.model.checkpoint import drafter_config
from dflash.eval.speed import ratio_interval

NGRAM_MODES = ("ngram-simple", "ngram-mod", "ngram-map-k", "ngram-cache")


def decode_all(port: int, prompts: list, n: int, concurrency: int) -> list:
    """Every prompt decoded on the server at `port`, `concurrency` requests at a time."""
    if concurrency <= 1:
        return [_complete(port, p, n) for p in prompts]
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda p: _complete(port, p, n), prompts))


@dataclass
class ModeSpeed:
    """One serving mode's decoding over every prompt, from the engine's own timings."""
    tokens_per_second: float  # total tokens / total decode seconds
    acceptance_length: float  # tokens per verify step
    drafted: int
    accepted: int
    per_prompt_tokens_per_second: list
    speedup: Optional[dict] = None  # over no speculation: value, lo, hi (paired 95%)
    outputs_equal: Optional[int] = None  # prompts whose tokens equal no speculation's
    OMIT_NONE = ("speedup", "outputs_equal")


@dataclass
class SpeedRun:
    concurrency: int
    modes: dict  # name -> ModeSpeed, "none" first (the base)
    best_ngram: Optional[str]


@dataclass
class SpeedReport:
    machine: str
    threads: int
    prompts: int
    max_new_tokens: int
    runs: list  # SpeedRun per concurrency

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, d: dict) -> "SpeedReport":
        runs = [SpeedRun(r["concurrency"], {k: ModeSpeed(**m) for k, m in r["modes"].items()},
                         r["best_ngram"]) for r in d["runs"]]
        return cls(d["machine"], d["threads"], d["prompts"], d["max_new_tokens"], runs)


def summarize(rows: list, base: list | None) -> ModeSpeed:
    """Completions of one mode; `base`: no speculation's, for the speedup."""
    tok = [r.predicted_n for r in rows]
    sec = [r.predicted_ms / 1000 for r in rows]
    accepted = sum(r.accepted for r in rows)
    out = ModeSpeed(sum(tok) / max(sum(sec), 1e-9), sum(tok) / max(sum(tok) - accepted, 1),
                    sum(r.drafted for r in rows), accepted,
                    [a / max(b, 1e-9) for a, b in zip(tok, sec)])
    if base is not None:
        out.speedup = ratio_interval(tok, sec, [r.predicted_n for r in base],
                                     [r.predicted_ms / 1000 for r in base])
        out.outputs_equal = sum(r.tokens == b.tokens for r, b in zip(rows, base))
    return out


def measure(tree: Path, target_gguf: Path, modes: dict, prompts: list, n: int,
            concurrency: int, work: Path, threads: int | None = None) -> SpeedRun:
    """Every mode of `modes` ({name: llama-server args}); "none" first, the base."""
    results, base = {}, None
    for name, args in {"none": [], **modes}.items():
        with serving(tree, target_gguf, args, work / f"server-{name}-c{concurrency}.log",
                     threads, slots=concurrency, context=slot_context(prompts, n)) as port:
            decode_all(port, prompts[:1], min(8, n), 1)  # first-call costs untimed
            rows = decode_all(port, prompts, n, concurrency)
        results[name] = summarize(rows, base)
        base = base or rows
    ngram = {k: v for k, v in results.items() if k in NGRAM_MODES}
    best = max(ngram, key=lambda k: ngram[k].tokens_per_second) if ngram else None
    return SpeedRun(concurrency, results, best)


def load_prompts(path: Path, limit: int) -> list:
    """Token-id prompts from a dflash eval report (JSON: its `prompt_ids` lists) or a
    JSONL of {"prompt_ids": [...]}, each checked (the file and line or index named)."""
    if not path.is_file():
        raise DataError(f"--prompts {path}: no such file")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        doc = None  # JSON Lines (or not JSON at all: the line loader names the line)
    rows = doc.get("prompt_ids") if isinstance(doc, dict) else None
    if not (isinstance(rows, list) and rows and isinstance(rows[0], list)):
        # JSON Lines (a one-line file is a JSON document too: its prompt_ids is one prompt)
        return jsonl_prompts(path, limit if limit > 0 else -1)
    return [prompt_ids(r, str(path), f"prompt_ids[{i}]")
            for i, r in enumerate(rows[:limit if limit > 0 else None])]


def check_inputs(prompts: list, target: Path, drafters: list) -> dict:
    """{name: drafter dir} of `--drafter NAME=DIR`, each with its config.json, and the
    prompts inside the target's vocabulary: refused before any conversion or server."""
    out = {}
    for spec in drafters:
        name, _, d = spec.partition("=")
        if not name or not d:
            raise DataError(f"--drafter {spec}: give NAME=DIR")
        try:
            drafter_config(d)  # its config.json and weights' header read
        except DataError as exc:
            raise DataError(f"--drafter {spec}: {exc}") from None
        out[name] = Path(d)
    if not (target / "config.json").is_file():
        raise DataError(f"--target {target}: no config.json (give the target's HF directory)")
    try:
        cfg = json.loads((target / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"--target {target}: config.json is not JSON ({exc})") from None
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    top = max(max(p) for p in prompts)
    if vocab and top >= int(vocab):
        bad = next(i for i, p in enumerate(prompts) if max(p) == top)
        raise DataError(f"prompt {bad} holds token id {top}, outside the target's vocabulary "
                        f"of {vocab} ({target / 'config.json'})")
    return out


def format_table(r: SpeedRun) -> str:
    lines = [f"{r.concurrency} concurrent request(s):", "",
             "| mode | tok/s | speedup (95% CI) | acceptance | outputs equal |",
             "| --- | --- | --- | --- | --- |"]
    for name, m in r.modes.items():
        sp = m.speedup
        cell = f"{sp['value']:.2f}x ({sp['lo']:.2f}-{sp['hi']:.2f})" if sp else "1"
        eq = f"{m.outputs_equal}/{len(m.per_prompt_tokens_per_second)}" if sp else "-"
        best = " (best n-gram)" if name == r.best_ngram else ""
        lines.append(f"| {name}{best} | {m.tokens_per_second:.1f} | {cell} | "
                     f"{m.acceptance_length:.2f} | {eq} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dflash.recipe.engine_speed",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", required=True, help="a built llama.cpp tree (make llama-cpp)")
    ap.add_argument("--target", required=True, type=Path, help="the target's HF directory")
    ap.add_argument("--prompts", required=True, type=Path)
    ap.add_argument("--drafter", action="append", default=[], metavar="NAME=DIR",
                    help="a dflash drafter export to serve as mode NAME (repeatable)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=0, help="the first N prompts (0: all)")
    ap.add_argument("--ngram", nargs="*", default=list(NGRAM_MODES))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("engine_speed.json"))
    ap.add_argument("--work", type=Path, default=cache_root() / "engine_speed")
    return ap


@user_errors_exit
def main(argv=None) -> SpeedReport:
    a = parser().parse_args(argv)
    check_file_path("--out", a.out)
    tree = llama_cpp_tree(a.llama_cpp, "--llama-cpp")
    a.work.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(a.prompts, a.limit)
    drafters = check_inputs(prompts, a.target, a.drafter)
    target_gguf = to_gguf(tree, a.target, a.work / "target.gguf")
    modes = {m: ["--spec-type", m] for m in a.ngram}
    for name, d in drafters.items():
        config = json.loads((d / "config.json").read_text())
        modes[name] = dflash_args(to_gguf(tree, d, a.work / f"{name}.gguf", target=a.target),
                                  config)
    report = SpeedReport(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                         a.threads or os.cpu_count(), len(prompts), a.max_new_tokens,
                         [measure(tree, target_gguf, modes, prompts, a.max_new_tokens, c, a.work,
                                  a.threads) for c in a.concurrency])
    a.out.write_text(json.dumps(report.to_json(), indent=2))
    print(f"{report.prompts} prompts, {a.max_new_tokens} new tokens, greedy, "
          f"{report.threads} threads ({report.machine})")
    for r in report.runs:
        print(format_table(r))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
