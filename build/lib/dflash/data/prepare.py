"""JSONL chat conversations -> the dflash token format.

    python -m dflash.data.prepare --jsonl chats.jsonl --tokenizer TOKENIZER_DIR --out DIR \
        [--max-seq-len 8192] [--overlong truncate|drop|error] [--workers 8] \
        [--bad-lines skip|error]

Each line is {"messages": [{"role": ..., "content": ...}, ...]} (also accepted:
"conversations"; an assistant message may carry "reasoning_content"). The tokenizer is
loaded from a local directory; each conversation is rendered with the tokenizer's own
chat template and tokenized with character offsets; `loss_mask.py` places the mask on
every assistant token and the token closing each turn. A line that cannot be used
(invalid UTF-8 or JSON, no assistant text, a reply the template does not render) is
skipped, counted and named with `file:line` in prepare_report.json, so one bad
conversation never ends a million-line job; `--bad-lines error` stops at the first.
"""
from __future__ import annotations

import argparse
import json
import sys
from functools import partial
import multiprocessing
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from dflash.errors import DataError, user_errors_exit
from dflash.data.format import DatasetWriter, TokenDataset
from dflash.data.loss_mask import assistant_mask, end_of_turn_ids
from dflash.data.overlong import OverlongReport, check_policy


BAD_LINE_POLICIES = ("skip", "error")
MAX_LISTED = 100  # skipped lines named in the report; the count covers all


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise DataError(f"tokenizer directory not found: {path}")
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not getattr(tok, "chat_template", None):
        raise DataError(f"tokenizer at {path} has no chat template")
    if not getattr(tok, "is_fast", False):
        raise DataError(f"tokenizer at {path} is not a fast tokenizer (character offsets "
                        "are needed to place the loss mask)")
    return tok


_WORKER = {}


def _init_worker(tokenizer_dir: str) -> None:
    tok = load_tokenizer(tokenizer_dir)
    _WORKER.update(tok=tok, eot=end_of_turn_ids(tok))  # the probe render: once per process


def read_record(raw: bytes, where: str) -> dict:
    """One JSONL line as a JSON object; a line that is not one is a DataError naming it."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at "
                        f"column {exc.start + 1})") from None
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: invalid JSON ({exc})") from exc
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object")
    return rec


def _encode_line(item, tok=None, eot=None):
    """(line number, ids, mask) or (line number, None, error message)."""
    line_no, raw, where = item
    tok, eot = (tok, eot) if tok is not None else (_WORKER["tok"], _WORKER["eot"])
    try:
        rec = read_record(raw, where)
        ids, mask = assistant_mask(tok, rec.get("messages", rec.get("conversations")), where, eot)
        return line_no, ids, mask
    except DataError as exc:
        return line_no, None, str(exc)


def jsonl_lines(jsonl: Path):
    """(line number, bytes, "file:line") of every non-empty line."""
    with jsonl.open("rb") as fh:  # bytes: a bad encoding is one bad line, named, not a crash
        for line_no, line in enumerate(fh, 1):
            if line.strip():
                yield line_no, line, f"{jsonl}:{line_no}"


def prepare(jsonl: str | Path, tokenizer_dir: str | Path, out: str | Path,
            max_seq_len: int = 8192, overlong: str = "error",
            workers: int = 1, bad_lines: str = "skip") -> tuple[TokenDataset, dict]:
    check_policy(overlong)
    if bad_lines not in BAD_LINE_POLICIES:
        raise DataError(f"bad_lines must be one of {BAD_LINE_POLICIES}, got {bad_lines!r}")
    jsonl = Path(jsonl)
    if not jsonl.exists():
        raise DataError(f"JSONL file not found: {jsonl}")
    tok = load_tokenizer(tokenizer_dir)
    report = OverlongReport(overlong, int(max_seq_len))
    skipped: list[str] = []
    writer = DatasetWriter(out, len(tok), {"source": str(jsonl), "tokenizer": str(tokenizer_dir)})
    total = sum(1 for _ in jsonl_lines(jsonl))
    # spawn, not fork: a parent that already ran a fast tokenizer (or any thread pool)
    # would hand forked workers locks held by threads that do not exist there (deadlock)
    pool = (multiprocessing.get_context("spawn").Pool(workers, _init_worker, (str(tokenizer_dir),))
            if workers > 1 else None)
    try:
        results = (pool.imap(_encode_line, jsonl_lines(jsonl), chunksize=64) if pool
                   else map(partial(_encode_line, tok=tok, eot=end_of_turn_ids(tok)),
                            jsonl_lines(jsonl)))
        for line_no, ids, mask in tqdm(results, total=total, desc="prepare", unit="conv"):
            if ids is None:
                if bad_lines == "error":
                    raise DataError(mask)
                skipped.append(mask)
                continue
            if len(ids) > max_seq_len:
                report.count += 1
                if overlong == "error":
                    raise DataError(f"{jsonl}:{line_no}: {len(ids)} tokens, more than "
                                    f"max_seq_len={max_seq_len} (use --overlong truncate or drop)")
                if overlong == "drop":
                    report.tokens_removed += len(ids)
                    continue
                if not mask[:max_seq_len].any():  # nothing left to learn: drop, and say so
                    report.dropped_unsupervised += 1
                    report.tokens_removed += len(ids)
                    continue
                report.tokens_removed += len(ids) - max_seq_len
                ids, mask = ids[:max_seq_len], mask[:max_seq_len]
            writer.add(ids, mask)
    finally:
        if pool:
            pool.terminate()
    ds = writer.close()
    summary = {"samples": len(ds), "tokens": int(ds.offsets[-1]),
               "supervised_tokens": int(np.asarray(ds.loss_mask).sum(dtype=np.int64)),
               **report.as_dict(), "skipped_lines": len(skipped),
               "skipped": skipped[:MAX_LISTED]}
    if skipped:
        print(f"prepare: skipped {len(skipped)} bad line(s) (bad_lines=skip), first: "
              f"{skipped[0]}; all listed in prepare_report.json", file=sys.stderr)
    if not len(ds):
        raise DataError(f"{jsonl}: no usable conversation ({len(skipped)} skipped, "
                        f"first: {skipped[0] if skipped else 'none'})")
    (Path(out) / "prepare_report.json").write_text(json.dumps(summary, indent=2))
    return ds, summary


@user_errors_exit
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-seq-len", type=int, default=8192)
    ap.add_argument("--overlong", default="error", choices=["truncate", "drop", "error"])
    ap.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    ap.add_argument("--bad-lines", default="skip", choices=BAD_LINE_POLICIES,
                    help="a line that cannot be used: skip it (counted, listed) or stop")
    args = ap.parse_args(argv)
    _, summary = prepare(args.jsonl, args.tokenizer, args.out, args.max_seq_len, args.overlong,
                         args.workers, args.bad_lines)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
