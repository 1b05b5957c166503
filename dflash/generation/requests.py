"""Chat JSONL -> generation requests: which assistant turn to regenerate, its prompt.

The input is what `dflash.data.prepare` reads ({"messages": [...]} or "conversations",
one conversation a line); a conversation that ends in a user turn (prompts only) gets its
reply as a new final assistant turn. `turns=last` regenerates each conversation's last assistant
turn; `turns=each` regenerates every assistant turn in order, each prompted with the
regenerated turns before it (round r regenerates turn r of every conversation that has
one). A line that cannot be used is skipped and named with `file:line` and why.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dflash.data.chat_formats import record_messages
from dflash.data.loss_mask import THINK_CLOSE, THINK_OPEN, check_messages
from dflash.data.prepare import jsonl_lines, read_record
from dflash.data.prompt_formats import as_chat
from dflash.errors import DataError

TURNS = ("last", "each")


@dataclass
class Conversation:
    index: int  # position in the input (output order)
    where: str  # file:line
    record: dict
    messages: list
    assistant_turns: list  # message indices of the assistant turns to regenerate
    replies: dict = field(default_factory=dict)  # message index -> generated reply


@dataclass
class Request:
    key: str  # "conversation/turn": stable across reruns of the same input
    conversation: int
    turn: int  # message index of the assistant turn
    where: str
    messages: list  # the conversation before this turn (earlier replies regenerated)
    prompt_ids: list = field(default_factory=list)


def read_conversations(paths, bad_lines: str = "skip", fmt: str = "chat") -> tuple[list, list]:
    """Every usable conversation of the files (records of `fmt`: chat, or a benchmark's
    own format, dflash.data.prompt_formats), and the skipped lines with reasons."""
    convs, skipped = [], []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise DataError(f"input file not found: {path}")
        for _, raw, where in jsonl_lines(path):
            try:
                convs.append(_parse(raw, where, len(convs), fmt))
            except DataError as exc:
                if bad_lines == "error":
                    raise
                skipped.append({"where": where, "reason": str(exc).split(": ", 1)[-1]})
    return convs, skipped


def _parse(raw: bytes, where: str, index: int, fmt: str = "chat") -> Conversation:
    rec = as_chat(read_record(raw, where), fmt, where)
    messages = record_messages(rec, where)  # ShareGPT, OpenAI parts and tool turns mapped
    check_messages(messages, where)
    if messages[-1]["role"] == "user":
        # prompts only (the usual input: the replies are to come from the target): the
        # reply to the last user turn is the final assistant turn to write
        messages = [*messages, {"role": "assistant", "content": ""}]
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise DataError(f"{where}: no assistant turn to regenerate and no final user turn "
                        "to answer")
    if turns[0] == 0:
        raise DataError(f"{where}: the conversation starts with an assistant turn (no prompt)")
    return Conversation(index, where, rec, messages, turns)


def requests_for_round(convs, turns: str, rnd: int) -> list[Request]:
    """Round `rnd`'s requests: the last turn (turns=last, round 0 only) or each
    conversation's rnd-th assistant turn (turns=each), prompted with the replies
    regenerated before it."""
    out = []
    for c in convs:
        if turns == "last":
            if rnd:
                continue
            t = c.assistant_turns[-1]
        else:
            if rnd >= len(c.assistant_turns):
                continue
            t = c.assistant_turns[rnd]
        msgs = [c.replies.get(i, m) for i, m in enumerate(c.messages[:t])]
        out.append(Request(f"{c.index}/{t}", c.index, t, c.where, msgs))
    return out


def num_rounds(convs, turns: str) -> int:
    if turns == "last" or not convs:
        return 1 if convs else 0
    return max(len(c.assistant_turns) for c in convs)


def split_reasoning(text: str) -> dict:
    """A generated reply as an assistant message; reasoning between think tags (as
    Qwen3-style templates emit it) goes to reasoning_content."""
    if THINK_CLOSE in text:
        head, answer = text.split(THINK_CLOSE, 1)
        reasoning = head.split(THINK_OPEN, 1)[-1].strip()
        return {"role": "assistant", "content": answer.strip(), "reasoning_content": reasoning}
    return {"role": "assistant", "content": text.strip()}


def output_record(c: Conversation, turns: str, results: dict,
                  template_kwargs: dict | None = None) -> dict:
    """The input record with its regenerated turns (messages after the last
    regenerated turn are dropped under turns=last: they answered the old reply)."""
    keep = c.assistant_turns[-1] + 1
    msgs = [c.replies.get(i, m) for i, m in enumerate(c.messages[:keep])]
    rec = {k: v for k, v in c.record.items() if k not in ("messages", "conversations")}
    rec["messages"] = msgs
    done = [results[f"{c.index}/{t}"] for t in c.assistant_turns if f"{c.index}/{t}" in results]
    rec["finish_reason"] = done[-1]["finish_reason"] if done else None
    rec["generated_tokens"] = int(sum(r["tokens"] for r in done))
    if turns == "each":
        rec["finish_reasons"] = [r["finish_reason"] for r in done]
    last = results.get(f"{c.index}/{c.assistant_turns[-1]}")
    if last is not None and "ids" in last:  # a local target: its tokens, exactly
        rec["token_ids"] = {"prompt": last["prompt_ids"], "reply": last["ids"],
                            "stop": last.get("stop_id"), "template_kwargs": template_kwargs or {}}
    return rec


def tokenize(reqs: list, tok, template_kwargs: dict, max_new_tokens: int,
             max_seq_len: int) -> tuple[list, list]:
    """Render each prompt with the tokenizer's chat template (generation prompt added,
    `template_kwargs` such as enable_thinking passed through); an empty prompt or one
    whose prompt + max_new_tokens exceeds max_seq_len is skipped, named."""
    kept, skipped = [], []
    for r in reqs:
        try:
            text = tok.apply_chat_template(r.messages, tokenize=False, add_generation_prompt=True,
                                           **template_kwargs)
        except Exception as exc:  # noqa: BLE001  (a template error is the line's problem)
            skipped.append({"where": r.where, "reason": f"the chat template failed: {exc}"})
            continue
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if not ids:
            skipped.append({"where": r.where, "reason": "empty prompt"})
        elif len(ids) + max_new_tokens > max_seq_len:
            skipped.append({"where": r.where, "reason": f"overlong prompt: {len(ids)} tokens + "
                            f"max_new_tokens {max_new_tokens} > max_seq_len {max_seq_len}"})
        else:
            r.prompt_ids = list(map(int, ids))
            kept.append(r)
    return kept, skipped
