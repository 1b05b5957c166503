"""A trained drafter served by llama.cpp, checked against dflash's own decoding.

llama.cpp serves DFlash drafters (`--spec-type draft-dflash`). Its own converter,
`convert_hf_to_gguf.py`, reads dflash's export (the public DFlash layout) with
`--target-model-dir` for the vocabulary, and the target converts as any HF model does.
`check` converts both (f32, so the weights are the ones dflash decoded with), starts
`llama-server` on loopback, decodes each prompt of a dflash eval report greedily and
returns, per prompt and pooled, whether the tokens equal dflash's and each engine's
acceptance length (emitted tokens per target verify step: a step emits its accepted
drafts plus one token of the target's own).
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from dflash.errors import ConfigError, ToolError, one_line
from dflash.eval.report import EvalReport
from dflash.records import declared, to_json


def llama_cpp_tree(setting: str | None, key: str = "llama_cpp") -> Path | None:
    """The llama.cpp tree to check with (`setting`, else $LLAMA_CPP_DIR), or None."""
    raw = setting or os.environ.get("LLAMA_CPP_DIR")
    if not raw:
        return None
    tree = Path(raw)
    for need in ("convert_hf_to_gguf.py", "build/bin/llama-server"):
        if not (tree / need).exists():
            raise ConfigError(f"{key}={tree}: no {need} there (a llama.cpp source tree with "
                              "DFlash support, built: cmake -B build && cmake --build build "
                              "--target llama-server)")
    return tree


def to_gguf(tree: Path, src: Path, out: Path, target: Path | None = None) -> Path:
    """llama.cpp's converter, its own gguf-py first on the path (its other needs, e.g.
    sentencepiece: llama.cpp's requirements/requirements-convert_hf_to_gguf.txt). A file
    converted before from the same source dir as it is now (its path and newest file's
    time in `OUT.src`) is reused: a retrained drafter or another target converts again."""
    made_from = out.with_name(out.name + ".src")
    files = src.iterdir() if src.is_dir() else ()
    source = f"{src.resolve()} {max((f.stat().st_mtime_ns for f in files), default=0)}"
    if out.exists() and made_from.exists() and made_from.read_text() == source:
        return out
    path = os.pathsep.join(filter(None, [str(tree / "gguf-py"), os.environ.get("PYTHONPATH")]))
    extra = ["--target-model-dir", str(target)] if target else []
    proc = subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(src),
                           "--outtype", "f32", "--outfile", str(out), *extra],
                          env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True)
    if proc.returncode:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise ToolError(f"llama.cpp's convert_hf_to_gguf.py failed on {src}: {tail[0]}")
    made_from.write_text(source)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_line(log_path: Path) -> str:
    """The server's own last word (why it exited: a model it cannot load, a bad flag)."""
    try:
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return f": {one_line(lines[-1], 200)}" if lines else ""


def _ready(port: int, proc: subprocess.Popen, timeout: float, log_path: Path) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise ToolError(f"llama-server exited with status {proc.returncode} before it "
                            f"was ready ({log_path}){_last_line(log_path)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise ToolError(f"llama-server was not ready after {timeout:.0f} s")


@contextlib.contextmanager
def serving(tree: Path, target_gguf: Path, args: list, log_path: Path, threads: int | None = None,
            slots: int = 1, timeout: float = 300, context: int = 4096):
    """llama-server on loopback for `target_gguf` with `args` (a speculation mode) and
    `context` tokens a slot; yields its port, and ends it (terminate, then kill) however
    the block ends."""
    port = _free_port()
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [str(tree / "build" / "bin" / "llama-server"), "-m", str(target_gguf), *map(str, args),
             "--host", "127.0.0.1", "--port", str(port), "-t", str(threads or os.cpu_count()),
             "-c", str(int(context) * slots), "-np", str(slots), "--no-warmup"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            _ready(port, server, timeout, Path(log_path))
            yield port
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@dataclass
class Completion:
    """One greedy completion as llama-server reports it (its own decode timing: prompt
    processing excluded)."""
    tokens: list
    drafted: int
    accepted: int
    predicted_n: int
    predicted_ms: float


def slot_context(prompts: list, n: int, block: int = 16) -> int:
    """Tokens a server slot needs for the longest prompt, its `n` new tokens and one
    block of drafts in flight (at least llama-server's usual 4096)."""
    return max(4096, max(len(p) for p in prompts) + int(n) + int(block))


def _complete(port: int, ids: list, n: int) -> Completion:
    body = {"prompt": ids, "n_predict": n, "temperature": 0, "top_k": 1,
            "cache_prompt": False, "return_tokens": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
    except urllib.error.HTTPError as exc:  # the server's refusal, in its own words
        said = one_line(exc.read().decode("utf-8", "replace")) or exc.reason
        raise ToolError(f"llama-server refused a prompt of {len(ids)} tokens (n_predict={n}): "
                        f"HTTP {exc.code}: {said}") from None
    except OSError as exc:  # gone (crashed, killed) or silent past the timeout
        raise ToolError(f"llama-server on port {port} did not answer a prompt of {len(ids)} "
                        f"tokens: {exc} (its log is beside the GGUF files)") from None
    t = out.get("timings") or {}
    return Completion([int(x) for x in out.get("tokens", [])], int(t.get("draft_n", 0)),
                      int(t.get("draft_n_accepted", 0)), int(t.get("predicted_n", 0)),
                      float(t.get("predicted_ms", 0.0)))


def drafter_kind(config: dict) -> tuple[str, int]:
    """(llama.cpp's speculation type, drafts a block) for an exported drafter's config:
    a DSpark export (a Markov head, llama.cpp's auto-detection key) is draft-dspark, and
    anchor-first it drafts every slot of the block."""
    block = int(config["dflash_config"]["block_size"])
    if "DSparkDraftModel" in config.get("architectures", []) and (
            config.get("markov_rank") or config.get("markov_head_placeholder")):
        return "draft-dspark", block if config.get("sample_from_anchor", True) else block - 1
    return "draft-dflash", block - 1


def dflash_args(drafter_gguf: Path, config: dict, confidence_stop: float = 0.0) -> list:
    """llama-server's arguments for an exported drafter (its config.json, read), a
    DSpark one's confidence stop included (`--spec-draft-p-min`)."""
    kind, drafts = drafter_kind(config)
    stop = ["--spec-draft-p-min", confidence_stop] if confidence_stop > 0 else []
    return ["--spec-type", kind, "--model-draft", drafter_gguf, "--spec-draft-n-max", drafts,
            *stop]


def pooled(tokens: int, accepted: int) -> float:
    """Acceptance length: emitted tokens per verify step (accepted drafts + 1 a step)."""
    return tokens / max(tokens - accepted, 1)


@dataclass
class ServedPrompt(Completion):
    """A prompt llama.cpp decoded beside dflash's decoding of it."""
    n: int = 0  # tokens llama.cpp generated
    equal: bool = False  # the same tokens as dflash's
    dflash_tokens: int = 0
    dflash_accepted: int = 0
    dflash_last_step_accepted: Optional[int] = None


@dataclass
class EngineAcceptance:
    llama_cpp: float  # pooled acceptance length llama-server reported
    dflash: float  # dflash's on the same prompts


@dataclass
class EqualPrompts(EngineAcceptance):
    same_accepted_per_prompt: bool = False
    # the engines may count the step that reaches the token cap or EOS differently: when
    # this holds, the totals are consistent with every earlier step agreeing (the server
    # reports totals, not steps); None: the eval report has no last-step counts
    differences_only_in_final_step: Optional[bool] = None


@dataclass
class ServingCheck:
    """llama.cpp serving a drafter against dflash's decoding of the same prompts."""
    prompts: int
    equal_tokens: int  # prompts whose tokens llama.cpp decoded equal to dflash's
    block_size: int
    spec_type: str  # draft-dflash | draft-dspark
    llama_cpp: float
    dflash: float
    equal_prompts: EqualPrompts
    # llama-server's counts, dflash's beside, prompt by prompt (None: left in its own file)
    per_prompt: Optional[list] = field(default_factory=list)
    OMIT_NONE = ("per_prompt",)

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, d: dict) -> "ServingCheck":
        out = cls(**declared(cls, d))
        out.equal_prompts = EqualPrompts(**d["equal_prompts"])
        out.spec_type = d.get("spec_type", "draft-dflash")
        if out.per_prompt is not None:
            out.per_prompt = [ServedPrompt(**row) for row in out.per_prompt]
        return out


def check(tree: Path, target: Path, drafter: Path, report: EvalReport, out: Path,
          threads: int | None = None, timeout: float = 300) -> ServingCheck:
    """Serve `drafter` for `target` in llama.cpp and decode `report`'s prompts (a dflash
    eval report: prompt_ids, tokens, per-prompt steps, and the confidence stop it decoded
    with), greedy."""
    config = json.loads((drafter / "config.json").read_text())
    block = int(config["dflash_config"]["block_size"])
    kind, _ = drafter_kind(config)
    out.mkdir(parents=True, exist_ok=True)
    target_gguf = to_gguf(tree, target, out / "target.gguf")
    drafter_gguf = to_gguf(tree, drafter, out / "drafter.gguf", target=target)
    args = dflash_args(drafter_gguf, config, float(report.confidence_stop or 0.0))
    last = report.per_prompt_last_step_accepted or [None] * len(report.tokens)
    with serving(tree, target_gguf, args, out / "server.log", threads, timeout=timeout,
                 context=slot_context(report.prompt_ids, max(map(len, report.tokens)), block)
                 ) as port:
        rows = []
        for ids, ours, steps, fin in zip(report.prompt_ids, report.tokens,
                                         report.per_prompt_steps, last):
            got = _complete(port, [int(x) for x in ids], len(ours))
            rows.append(ServedPrompt(**vars(got), n=len(got.tokens), equal=got.tokens == list(ours),
                                     dflash_tokens=len(ours), dflash_accepted=len(ours) - int(steps),
                                     dflash_last_step_accepted=fin))
    same = [r for r in rows if r.equal]

    def engines(rs) -> EngineAcceptance:
        return EngineAcceptance(pooled(sum(r.n for r in rs), sum(r.accepted for r in rs)),
                                pooled(sum(r.dflash_tokens for r in rs),
                                       sum(r.dflash_accepted for r in rs)))
    every, eq = engines(rows), engines(same)
    final = None if None in last else all(
        r.dflash_accepted - r.dflash_last_step_accepted <= r.accepted <= r.dflash_accepted
        for r in same)
    return ServingCheck(len(rows), len(same), block, kind, every.llama_cpp, every.dflash,
                        EqualPrompts(eq.llama_cpp, eq.dflash, all(
                            r.accepted == r.dflash_accepted for r in same), final), rows)


def format_check(c: ServingCheck) -> str:
    e = c.equal_prompts
    return (f"llama.cpp ({c.spec_type}, block {c.block_size}): {c.equal_tokens}/{c.prompts} "
            f"held-out prompts decode dflash's tokens; acceptance llama.cpp {c.llama_cpp:.3f}, "
            f"dflash {c.dflash:.3f}" + (
                f"; on the equal prompts {e.llama_cpp:.3f} against {e.dflash:.3f}, "
                f"accepted drafts equal prompt by prompt: {e.same_accepted_per_prompt}"
                + ("" if e.same_accepted_per_prompt or e.differences_only_in_final_step
                   is None else "; every difference within the final verify step: "
                   f"{e.differences_only_in_final_step}")
                if c.equal_tokens else ""))
