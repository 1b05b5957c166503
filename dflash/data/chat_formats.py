"""Chat records as they are published, mapped to one message list.

    {"messages": [{"role": "user", "content": "..."}, ...]}          OpenAI / UltraChat
    {"conversations": [{"from": "human", "value": "..."}, ...]}      ShareGPT
    {"conversations": [{"role": ..., "content": ...}]}               (either key, either form)

OpenAI-style extras are kept for the chat template: an assistant turn's `tool_calls` (its
`content` may be null), `tool` turns with `tool_call_id` / `name`, `reasoning_content`
(also spelled `reasoning`); `content` given as a list of text parts is joined. ShareGPT's
`from` maps human -> user, gpt -> assistant, system, and function_call / observation /
tool -> assistant / tool. Anything else is refused naming the line and the value.
"""
from __future__ import annotations

import json

from dflash.errors import DataError

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant",
                  "model": "assistant", "system": "system", "function_call": "assistant",
                  "observation": "tool", "function": "tool", "tool": "tool"}
ROLES = ("system", "developer", "user", "assistant", "tool")


def _text(content, where: str, j: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        for p in content:
            if not isinstance(p, dict):
                raise DataError(f"{where}: message {j} has a content part of type "
                                f"{type(p).__name__}, not an object like "
                                '{"type": "text", "text": "..."}')
            if p.get("type") != "text":
                raise DataError(f"{where}: message {j} has a {p.get('type')!r} content part; "
                                "only text parts can be tokenized")
            if not isinstance(p.get("text", ""), str):
                raise DataError(f"{where}: message {j} has a text part whose 'text' is of type "
                                f"{type(p['text']).__name__}, not a string")
        return "".join(p.get("text", "") for p in content)
    raise DataError(f"{where}: message {j} 'content' must be a string, a list of text parts "
                    f"or null, not {type(content).__name__}")


def _message(m, where: str, j: int) -> dict:
    if not isinstance(m, dict):
        raise DataError(f"{where}: message {j} is not an object")
    if "from" in m and "role" not in m:  # ShareGPT
        who = str(m["from"]).lower()
        if who not in SHAREGPT_ROLES:
            raise DataError(f"{where}: message {j} has from={m['from']!r}, not a ShareGPT role "
                            f"({', '.join(sorted(SHAREGPT_ROLES))})")
        out = {"role": SHAREGPT_ROLES[who], "content": _text(m.get("value"), where, j)}
        if who == "function_call":  # the call itself, as the template renders text
            out["content"] = out["content"] if isinstance(m.get("value"), str) else json.dumps(m.get("value"))
        return out
    if "role" not in m:
        raise DataError(f"{where}: message {j} needs 'role' (or ShareGPT's 'from') and "
                        "'content' (or 'value')")
    role = str(m["role"])
    if role not in ROLES:
        raise DataError(f"{where}: message {j} has role={role!r} (one of {', '.join(ROLES)})")
    content = m.get("content", m.get("value"))
    if content is None and not (role == "assistant" and m.get("tool_calls")):
        raise DataError(f"{where}: message {j} needs 'role' and a string 'content' (null only "
                        "on an assistant turn with tool_calls)")
    out = {k: v for k, v in m.items() if k not in ("content", "reasoning")}
    out["content"] = _text(content, where, j)
    if m.get("reasoning") and not m.get("reasoning_content"):
        out["reasoning_content"] = m["reasoning"]
    return out


def record_messages(rec: dict, where: str) -> list:
    """The record's conversation as role/content messages (refused in one line naming
    `where` when it cannot be mapped)."""
    raw = rec.get("messages", rec.get("conversations"))
    if not isinstance(raw, list) or not raw:
        keys = ", ".join(sorted(rec)) or "none"
        raise DataError(f"{where}: no 'messages' or 'conversations' list (keys: {keys})")
    return [_message(m, where, j) for j, m in enumerate(raw)]
