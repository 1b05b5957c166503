"""Benchmark files as chat prompts: GSM8K, HumanEval, MT-Bench and chat JSONL.

Users bring the standard files; `dflash.eval` and `dflash.regenerate` read them with
`format=`. Each record becomes a prompt-only conversation, worded as the public DFlash
benchmarks prompt them:

    gsm8k      {"question": ...}  -> "<question>\\nPlease reason step by step, and put your
                                       final answer within \\boxed{}."
    humaneval  {"prompt": ...}    -> "Write a solution to the following problem and make
                                       sure that it passes the tests:\\n```python\\n<prompt>\\n```"
    mtbench    {"turns": [...]} (or "prompt": [...]) -> its user turns; a turn after the
               first is preceded by an empty assistant turn that `turns=each` regenerates
    chat       {"messages" | "conversations": [...]}, as `prepare` reads it

A record that does not fit its format is a DataError naming `file:line`.
"""
from __future__ import annotations

from dflash.errors import DataError

FORMATS = ("chat", "gsm8k", "humaneval", "mtbench")
GSM8K = "{}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
HUMANEVAL = ("Write a solution to the following problem and make sure that it passes the "
             "tests:\n```python\n{}\n```")


def as_chat(rec: dict, fmt: str, where: str) -> dict:
    """The record as {"messages": [...], **its other fields} (prompt-only for benchmarks)."""
    if fmt not in FORMATS:
        raise DataError(f"format={fmt!r}: one of {', '.join(FORMATS)}")
    if fmt == "chat":
        return rec
    key = {"gsm8k": "question", "humaneval": "prompt", "mtbench": "turns"}[fmt]
    value = rec.get(key, rec.get("prompt") if fmt == "mtbench" else None)
    if fmt == "mtbench":
        if not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value):
            raise DataError(f"{where}: an MT-Bench record needs 'turns' (a list of strings)")
        messages = []
        for i, turn in enumerate(value):
            if i:
                messages.append({"role": "assistant", "content": ""})
            messages.append({"role": "user", "content": turn})
    else:
        if not isinstance(value, str) or not value.strip():
            raise DataError(f"{where}: a {fmt} record needs a non-empty string '{key}'")
        text = (GSM8K if fmt == "gsm8k" else HUMANEVAL).format(value)
        messages = [{"role": "user", "content": text}]
    return {**{k: v for k, v in rec.items() if k != key}, "messages": messages}


def first_prompt(messages: list) -> list:
    """The conversation up to its first user turn (evaluation drafts the first reply)."""
    for i, m in enumerate(messages):
        if m.get("role") == "user":
            return messages[:i + 1]
    return messages
