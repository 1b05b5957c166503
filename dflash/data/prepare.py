"""JSONL chat conversations -> the dflash token format.

    python -m dflash.data.prepare --jsonl chats.jsonl --tokenizer TOKENIZER_DIR --out DIR \
        [--max-seq-len 8192] [--overlong truncate|drop|error]

Each line is {"messages": [{"role": ..., "content": ...}, ...]} (also accepted:
"conversations"). The tokenizer is loaded from a local directory and renders each
conversation with its own chat template; the loss mask covers exactly the tokens each
assistant turn adds to the rendered conversation.
"""
from __future__ import annotations

import argparse
import json
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
    return tok


def _ids(tok, messages, add_generation_prompt: bool) -> list[int]:
    out = tok.apply_chat_template(messages, tokenize=True,
                                  add_generation_prompt=add_generation_prompt)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def encode_conversation(tok, messages: list[dict], where: str) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and assistant-only loss mask for one conversation.

    For assistant turn i the supervised span runs from the end of
    render(messages[:i], generation prompt) to the end of render(messages[:i+1]); the
    template must render prefixes as prefixes, which is checked.
    """
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: 'messages' must be a non-empty list")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataError(f"{where}: message {j} needs 'role' and 'content'")
    full = _ids(tok, messages, add_generation_prompt=False)
    mask = np.zeros(len(full), dtype=np.uint8)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(_ids(tok, messages[:i], add_generation_prompt=True)) if i else 0
        upto = _ids(tok, messages[:i + 1], add_generation_prompt=False)
        if full[:len(upto)] != upto:
            raise DataError(f"{where}: the chat template does not render turn {i} as a prefix "
                            "of the conversation; cannot place the loss mask")
        mask[start:len(upto)] = 1
    if not mask.any():
        raise DataError(f"{where}: no assistant turn, nothing to supervise")
    return np.asarray(full, dtype=np.int64), mask


def prepare(jsonl: str | Path, tokenizer_dir: str | Path, out: str | Path,
            max_seq_len: int = 8192, overlong: str = "error") -> tuple[TokenDataset, dict]:
    check_policy(overlong)
    jsonl = Path(jsonl)
    if not jsonl.exists():
        raise DataError(f"JSONL file not found: {jsonl}")
    tok = load_tokenizer(tokenizer_dir)
    vocab = len(tok)
    report = OverlongReport(overlong, int(max_seq_len))
    writer = DatasetWriter(out, vocab, {"source": str(jsonl), "tokenizer": str(tokenizer_dir)})
    total = sum(1 for _ in jsonl.open())
    with jsonl.open() as fh:
        for line_no, line in enumerate(tqdm(fh, total=total, desc="prepare", unit="conv"), 1):
            if not line.strip():
                continue
            where = f"{jsonl}:{line_no}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: invalid JSON ({exc})") from exc
            messages = rec.get("messages", rec.get("conversations"))
            ids, mask = encode_conversation(tok, messages, where)
            if len(ids) > max_seq_len:
                report.count += 1
                if overlong == "error":
                    raise DataError(f"{where}: {len(ids)} tokens, more than max_seq_len="
                                    f"{max_seq_len} (use --overlong truncate or drop)")
                if overlong == "drop":
                    report.tokens_removed += len(ids)
                    continue
                report.tokens_removed += len(ids) - max_seq_len
                ids, mask = ids[:max_seq_len], mask[:max_seq_len]
                if not mask.any():
                    continue  # truncation removed every supervised token
            writer.add(ids, mask)
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
    args = ap.parse_args(argv)
    _, summary = prepare(args.jsonl, args.tokenizer, args.out, args.max_seq_len, args.overlong)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
