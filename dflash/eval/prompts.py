"""Held-out prompts for `python -m dflash.eval`, and the drafter/target fit check."""
from __future__ import annotations


def load_prompts(path, limit: int = -1, fmt: str = "prompt_ids", tokenizer=None) -> list:
    """Prompts from a JSONL file ({"prompt_ids": [...]} per line), a dflash data set
    directory (each sample's tokens before its first supervised one), or, with `fmt`
    chat | gsm8k | humaneval | mtbench, benchmark records rendered through `tokenizer`'s
    chat template (`dflash.data.prompt_formats`)."""
    import json
    from pathlib import Path

    from dflash.errors import DataError

    path = Path(path)
    prompts = []
    if fmt != "prompt_ids" and not path.is_dir():
        return _chat_prompts(path, limit, fmt, tokenizer)
    if path.is_dir():
        from dflash.data.format import TokenDataset
        from dflash.sources.build import prompt_of
        ds = TokenDataset.open(path)
        n = len(ds) if limit < 0 else min(limit, len(ds))
        return [prompt_of(*ds.sample(i)).tolist() for i in range(n)]
    if not path.exists():
        raise DataError(f"prompts file not found: {path}")
    with open(path, encoding="utf-8", errors="strict") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{n}: invalid JSON ({exc})") from None
            if not isinstance(rec, dict) or "prompt_ids" not in rec:
                raise DataError(f"{path}:{n}: no 'prompt_ids' (token ids of the prompt)")
            prompts.append(prompt_ids(rec["prompt_ids"], f"{path}:{n}"))
            if 0 <= limit <= len(prompts):
                break
    if not prompts:
        raise DataError(f"{path}: no prompts")
    return prompts


def prompt_ids(ids, where: str, key: str = "'prompt_ids'") -> list:
    """One prompt's token ids, checked: a non-empty list of non-negative ints."""
    from dflash.errors import DataError

    if not isinstance(ids, list) or not ids or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise DataError(f"{where}: {key} must be a non-empty list of token ids "
                        "(non-negative ints)")
    return ids


def _chat_prompts(path, limit: int, fmt: str, tok) -> list:
    """Each record's prompt (chat: before its last assistant turn; mtbench: its first
    user turn) rendered with the chat template's generation prompt, as token ids."""
    from dflash.data.prepare import jsonl_lines, read_record
    from dflash.data.prompt_formats import as_chat, first_prompt
    from dflash.errors import DataError

    if tok is None:
        raise DataError(f"format={fmt} renders prompts with a chat template: set tokenizer=DIR "
                        "(or model.target.path)")
    if not path.exists():
        raise DataError(f"prompts file not found: {path}")
    prompts = []
    for _, raw, where in jsonl_lines(path):
        msgs = as_chat(read_record(raw, where), fmt, where).get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise DataError(f"{where}: no 'messages' list")
        if fmt == "mtbench":
            msgs = first_prompt(msgs)
        while msgs and msgs[-1].get("role") == "assistant":
            msgs = msgs[:-1]
        if not msgs:
            raise DataError(f"{where}: no prompt before the reply")
        from jinja2.exceptions import TemplateError
        try:
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        except TemplateError as exc:  # the template's own refusal (a role it does not support)
            raise DataError(f"{where}: the tokenizer's chat template refuses it: {exc}") from exc
        prompts.append(list(map(int, tok(text, add_special_tokens=False)["input_ids"])))
        if 0 <= limit <= len(prompts):
            break
    if not prompts:
        raise DataError(f"{path}: no prompts")
    return prompts


def check_pair(drafter, target, prompts, where: str) -> None:
    """A drafter trained for another target loads silently and accepts ~nothing: refuse."""
    from dflash.errors import DataError

    s = drafter.spec
    n = len(target.base.layers)
    problems = []
    if s.hidden_size != target.hidden_size:
        problems.append(f"hidden size {s.hidden_size} vs the target's {target.hidden_size}")
    if s.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {s.vocab_size} vs the target's {target.vocab_size}")
    if s.num_target_layers != n or max(s.target_layer_ids) >= n:
        problems.append(f"target_layer_ids {s.target_layer_ids} of a {s.num_target_layers}-layer "
                        f"target vs this {n}-layer one")
    if problems:
        raise DataError(f"{where} does not fit the target: " + "; ".join(problems))
    bad = [i for i, p in enumerate(prompts) if max(p) >= target.vocab_size]
    if bad:
        raise DataError(f"prompt {bad[0]} holds token id {max(prompts[bad[0]])} outside the "
                        f"target vocabulary of {target.vocab_size}")
