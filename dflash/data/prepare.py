"""JSONL chat conversations -> the dflash token format.

    python -m dflash.data.prepare --jsonl chats.jsonl --tokenizer TOKENIZER_DIR --out DIR \
        [--max-seq-len 8192] [--overlong truncate|drop|error] [--workers 8]

Each line is {"messages": [{"role": ..., "content": ...}, ...]} (also accepted:
"conversations"). The tokenizer is loaded from a local directory; each conversation is
rendered once with the tokenizer's own chat template and tokenized with character
offsets. The loss mask covers each assistant message's content as it appears in the
rendered text, plus the special token that closes the turn (so the drafter learns
where answers end). Locating content in the rendered text, rather than rendering
prefixes, also works for templates that render earlier turns differently (Qwen3 strips
past reasoning), and costs one render per conversation.
"""
from __future__ import annotations

import argparse
import json
from functools import partial
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ..errors import DataError
from .format import DatasetWriter, TokenDataset
from .overlong import OverlongReport, check_policy


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


def _check_messages(messages, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: 'messages' must be a non-empty list")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: message {j} needs 'role' and a string 'content'")


def encode_conversation(tok, messages: list[dict], where: str) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and assistant-only loss mask (uint8) for one conversation."""
    _check_messages(messages, where)
    text = tok.apply_chat_template(messages, tokenize=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    starts = np.asarray([s for s, _ in enc["offset_mapping"]], dtype=np.int64)
    special = set(tok.all_special_ids)
    mask = np.zeros(len(ids), dtype=np.uint8)
    cursor = 0
    for j, m in enumerate(messages):
        if m["role"] != "assistant" or not m["content"].strip():
            continue
        content = m["content"].strip()
        pos = text.find(content, cursor)
        if pos < 0:
            raise DataError(f"{where}: assistant message {j} does not appear in the text the "
                            "chat template renders; cannot place the loss mask")
        end = pos + len(content)
        lo = int(np.searchsorted(starts, pos, side="left"))
        hi = int(np.searchsorted(starts, end, side="left"))
        # the turn's closing special token (<|im_end|>, eos, ...) is supervised too
        if hi < len(ids) and int(ids[hi]) in special and not text[end:starts[hi]].strip():
            hi += 1
        mask[lo:hi] = 1
        cursor = end
    if not mask.any():
        raise DataError(f"{where}: no assistant content, nothing to supervise")
    return ids, mask


_WORKER_TOK = {}


def _init_worker(tokenizer_dir: str) -> None:
    _WORKER_TOK["tok"] = load_tokenizer(tokenizer_dir)


def _encode_line(item, tok=None):
    """(line number, ids, mask) or (line number, None, error message)."""
    line_no, line, where = item
    tok = tok or _WORKER_TOK["tok"]
    try:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: invalid JSON ({exc})") from exc
        if not isinstance(rec, dict):
            raise DataError(f"{where}: expected a JSON object")
        ids, mask = encode_conversation(tok, rec.get("messages", rec.get("conversations")), where)
        return line_no, ids, mask
    except DataError as exc:
        return line_no, None, str(exc)


def _lines(jsonl: Path):
    with jsonl.open() as fh:
        for line_no, line in enumerate(fh, 1):
            if line.strip():
                yield line_no, line, f"{jsonl}:{line_no}"


def prepare(jsonl: str | Path, tokenizer_dir: str | Path, out: str | Path,
            max_seq_len: int = 8192, overlong: str = "error",
            workers: int = 1) -> tuple[TokenDataset, dict]:
    check_policy(overlong)
    jsonl = Path(jsonl)
    if not jsonl.exists():
        raise DataError(f"JSONL file not found: {jsonl}")
    tok = load_tokenizer(tokenizer_dir)
    report = OverlongReport(overlong, int(max_seq_len))
    writer = DatasetWriter(out, len(tok), {"source": str(jsonl), "tokenizer": str(tokenizer_dir)})
    total = sum(1 for _ in _lines(jsonl))
    pool = Pool(workers, _init_worker, (str(tokenizer_dir),)) if workers > 1 else None
    try:
        results = (pool.imap(_encode_line, _lines(jsonl), chunksize=64) if pool
                   else map(partial(_encode_line, tok=tok), _lines(jsonl)))
        for line_no, ids, mask in tqdm(results, total=total, desc="prepare", unit="conv"):
            if ids is None:
                raise DataError(mask)
            if len(ids) > max_seq_len:
                report.count += 1
                if overlong == "error":
                    raise DataError(f"{jsonl}:{line_no}: {len(ids)} tokens, more than "
                                    f"max_seq_len={max_seq_len} (use --overlong truncate or drop)")
                if overlong == "drop":
                    report.tokens_removed += len(ids)
                    continue
                report.tokens_removed += len(ids) - max_seq_len
                ids, mask = ids[:max_seq_len], mask[:max_seq_len]
                if not mask.any():
                    continue  # truncation removed every supervised token
            writer.add(ids, mask)
    finally:
        if pool:
            pool.terminate()
    ds = writer.close()
    summary = {"samples": len(ds), "tokens": int(ds.offsets[-1]),
               "supervised_tokens": int(np.asarray(ds.loss_mask).sum(dtype=np.int64)),
               **report.as_dict()}
    (Path(out) / "prepare_report.json").write_text(json.dumps(summary, indent=2))
    return ds, summary


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-seq-len", type=int, default=8192)
    ap.add_argument("--overlong", default="error", choices=["truncate", "drop", "error"])
    ap.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    args = ap.parse_args(argv)
    _, summary = prepare(args.jsonl, args.tokenizer, args.out, args.max_seq_len, args.overlong,
                         args.workers)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
