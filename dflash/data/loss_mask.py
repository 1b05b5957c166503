"""Where each assistant turn is in a rendered chat, and which tokens the drafter learns.

The drafter must learn exactly what serving will ask it to draft: every token of each
assistant reply (its reasoning too, where the template renders it) and the token that
closes the turn. Three things make that harder than a text search:

- a short reply ("4", "Yes.") often also occurs in the user or system text, so each
  assistant turn is located by its own position: the length of the rendered prefix of
  the conversation up to that turn (with the generation prompt), when the template
  renders prefixes consistently; otherwise a cursor that moves past every message;
- templates rewrite turns (Qwen3 drops past reasoning, Llama puts a space before the
  reply), so the reply is matched by its final answer text inside the turn's region,
  which ends at the turn's end-of-turn token;
- tokenizers merge the space before a reply into its first token (`▁I`, `ĠI`), so a token
  is supervised when it overlaps the reply, not only when it starts inside it; whitespace
  tokens after the reply and the end-of-turn token are supervised as well.
"""
from __future__ import annotations

import numpy as np

from dflash.errors import DataError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def check_messages(messages, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: 'messages' must be a non-empty list")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: message {j} needs 'role' and a string 'content'")


def reply_parts(message: dict) -> tuple[str, str]:
    """(reasoning, final answer), both stripped; reasoning may be ''."""
    content = message["content"]
    reasoning = message.get("reasoning_content") or ""
    if THINK_CLOSE in content:
        head, content = content.rsplit(THINK_CLOSE, 1)
        reasoning = reasoning or head.split(THINK_OPEN, 1)[-1]
    return reasoning.strip(), content.strip()


def end_of_turn_ids(tok) -> frozenset[int]:
    """The special token(s) a template closes an assistant turn with, found by rendering a
    probe conversation: the first special token after the reply (`<|im_end|>`, `</s>`,
    `<|eot_id|>`). Falls back to every special token when the probe finds none."""
    special = frozenset(tok.all_special_ids)
    probe = "zq"
    try:
        text = tok.apply_chat_template([{"role": "user", "content": "hello"},
                                        {"role": "assistant", "content": probe}], tokenize=False)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        after = text.rindex(probe) + len(probe)
        for i, (s, _) in zip(enc["input_ids"], enc["offset_mapping"]):
            if s >= after and i in special:
                return frozenset([i])
    except Exception:  # any template/probe failure: the general fallback below is safe
        pass
    return special


def turn_starts(tok, messages: list[dict], text: str) -> dict[int, int]:
    """Character offset in `text` where each assistant turn's generation begins."""
    starts, cursor = {}, 0
    for j, m in enumerate(messages):
        if m["role"] == "assistant":
            starts[j] = _prefix_len(tok, messages[:j], text)
            if starts[j] is None:
                starts[j] = cursor
        # the cursor moves past every message, user and system text included, so a reply
        # that also occurs in an earlier message is never matched there
        needle = reply_parts(m)[1] if m["role"] == "assistant" else m["content"].strip()
        pos = text.find(needle, max(cursor, starts.get(j, 0))) if needle else -1
        if pos >= 0:
            cursor = pos + len(needle)
    return starts


def _prefix_len(tok, prefix: list[dict], text: str) -> int | None:
    if not prefix:
        return None
    for gen in (True, False):
        try:
            head = tok.apply_chat_template(prefix, tokenize=False, add_generation_prompt=gen)
        except Exception:  # templates may refuse a prefix (e.g. strict role alternation)
            continue
        if text.startswith(head):
            return len(head)
    return None


def assistant_mask(tok, messages: list[dict], where: str,
                   eot: frozenset[int] | None = None,
                   cut_turns: frozenset[int] = frozenset()) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (int64) and loss mask (uint8) for one conversation. `cut_turns`: message
    indices of replies cut at max_new_tokens: the target never closed them, so their
    rendered end-of-turn token is not supervised (it would teach a false end of turn)."""
    check_messages(messages, where)
    eot = end_of_turn_ids(tok) if eot is None else eot
    text = tok.apply_chat_template(messages, tokenize=False)
    ids, mask = _masked(tok, messages, text, where, eot, cut_turns)
    if not mask.any():
        raise DataError(f"{where}: no assistant content, nothing to supervise")
    return ids, mask


def regenerated_mask(tok, messages: list[dict], token_ids: dict, where: str,
                     eot: frozenset[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Token-exact ids and mask of a conversation whose last assistant turn a local
    target wrote (`dflash.regenerate`'s `token_ids`: the prompt it was given, the ids it
    generated, the stop id it ended with or null when cut at max_new_tokens). The reply
    is the generated ids themselves, never its text re-tokenized; earlier assistant
    turns in the prompt are supervised as `assistant_mask` would."""
    check_messages(messages, where)
    eot = end_of_turn_ids(tok) if eot is None else eot
    try:
        prompt = [int(i) for i in token_ids["prompt"]]
        reply = [int(i) for i in token_ids["reply"]]
        stop = token_ids.get("stop")
        kwargs = dict(token_ids.get("template_kwargs") or {})
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{where}: token_ids needs integer lists 'prompt' and 'reply' "
                        f"({exc})") from None
    head = messages[:max(i for i, m in enumerate(messages) if m["role"] == "assistant")]
    text = tok.apply_chat_template(head, tokenize=False, add_generation_prompt=True, **kwargs)
    ids, mask = _masked(tok, head, text, where, eot, frozenset())
    if ids.tolist() != prompt:
        raise DataError(f"{where}: token_ids.prompt is not what this tokenizer's chat template "
                        "renders for the conversation (regenerated with another tokenizer?)")
    tail = reply + ([int(stop)] if stop is not None else [])
    if not tail:
        raise DataError(f"{where}: no assistant content, nothing to supervise")
    bad = [i for i in tail if not 0 <= i < len(tok)]
    if bad:
        raise DataError(f"{where}: token_ids.reply holds id {bad[0]}, outside the "
                        f"tokenizer's {len(tok)} tokens")
    return (np.concatenate([ids, np.asarray(tail, dtype=np.int64)]),
            np.concatenate([mask, np.ones(len(tail), dtype=np.uint8)]))


def _masked(tok, messages, text, where, eot, cut_turns) -> tuple[np.ndarray, np.ndarray]:
    """Ids of `text` (the rendered `messages`) and the mask over their assistant turns."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    offs = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    starts, ends = offs[:, 0], offs[:, 1]
    is_eot = np.isin(ids, np.fromiter(eot, dtype=np.int64, count=len(eot)))
    mask = np.zeros(len(ids), dtype=np.uint8)
    for j, t0 in turn_starts(tok, messages, text).items():
        reasoning, answer = reply_parts(messages[j])
        if not answer and not reasoning:
            continue
        first_eot = np.flatnonzero(is_eot & (starts >= t0))
        region_end = int(starts[first_eot[0]]) if len(first_eot) else len(text)
        needle = answer or reasoning
        pos = (text.rfind(needle, t0, region_end) if len(first_eot)
               else text.find(needle, t0, region_end))
        if pos < 0:
            raise DataError(f"{where}: assistant message {j} does not appear in the text the "
                            "chat template renders; cannot place the loss mask")
        lo_char, hi_char = pos, pos + len(needle)
        if answer:  # a reasoning block rendered in this turn (even empty) is generated too
            think = text.find(THINK_OPEN, t0, pos)
            rpos = text.find(reasoning, t0, pos) if reasoning else -1
            lo_char = think if think >= 0 else rpos if rpos >= 0 else pos
        lo = int(np.searchsorted(ends, lo_char, side="right"))  # first token ending inside
        hi = int(np.searchsorted(starts, hi_char, side="left"))
        if j not in cut_turns:  # a cut reply ends where it was cut
            while hi < len(ids) and not is_eot[hi] and not text[starts[hi]:ends[hi]].strip():
                hi += 1  # whitespace the model emits before closing the turn
            if hi < len(ids) and is_eot[hi] and not text[hi_char:starts[hi]].strip():
                hi += 1
        mask[lo:hi] = 1
    return ids, mask


def cut_turns(record: dict, messages: list[dict]) -> frozenset[int]:
    """Assistant turns a regeneration cut at max_new_tokens, from `dflash.regenerate`'s
    `finish_reasons` (turns=each: one per assistant turn, the last ones) or
    `finish_reason` (its last assistant turn)."""
    turns = [i for i, m in enumerate(messages if isinstance(messages, list) else [])
             if isinstance(m, dict) and m.get("role") == "assistant"]
    reasons = record.get("finish_reasons")
    if not isinstance(reasons, list):
        reasons = [record.get("finish_reason")] if turns else []
    return frozenset(t for t, r in zip(turns[len(turns) - len(reasons):], reasons)
                     if r == "length")
