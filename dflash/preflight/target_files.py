"""What a target directory says without its weights: `config.json`, and the tokenizer
(the full one where `tokenizer.json` is there, else `tokenizer_config.json` alone).

`tokenizer_config.json` holds every added token with its id and whether it is special,
the chat template and the bos/eos/pad names: enough to choose and check the drafter's
mask token the way the real start does (dflash.data.mask_token), on a laptop that has
the model's small files only.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from dflash.errors import DataError
from dflash.model.hf_config import hf_config


def read_config(path):
    return hf_config(path, files="a local HF model directory, or its config.json and "
                     "tokenizer files")


class ConfigTokenizer:
    """The special-token side of a tokenizer, from tokenizer_config.json: its length
    (past the highest added id), added tokens, bos/eos/pad/unk ids and the chat
    template; "tokenizing" a rendered template finds the special tokens it holds."""

    def __init__(self, conf: dict, where: Path):
        self.where = where
        added = conf.get("added_tokens_decoder") or {}
        self.added_tokens_decoder = {
            int(i): SimpleNamespace(content=t["content"], special=bool(t.get("special")))
            for i, t in added.items()}
        by_content = {t.content: i for i, t in self.added_tokens_decoder.items()}
        for name in ("bos", "eos", "pad", "unk"):
            tok = conf.get(f"{name}_token")
            tok = tok.get("content") if isinstance(tok, dict) else tok
            setattr(self, f"{name}_token", tok)
            setattr(self, f"{name}_token_id", by_content.get(tok))
        self.chat_template = conf.get("chat_template")
        self._len = max(self.added_tokens_decoder, default=-1) + 1

    def __len__(self) -> int:
        return self._len

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kw):
        from transformers.utils.chat_template_utils import render_jinja_template
        if not self.chat_template:
            raise ValueError(f"{self.where}: no chat_template")
        out = render_jinja_template(
            conversations=[messages], chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt, bos_token=self.bos_token,
            eos_token=self.eos_token, pad_token=self.pad_token, unk_token=self.unk_token, **kw)
        rendered = out[0] if isinstance(out, tuple) else out
        return rendered[0] if isinstance(rendered, list) else rendered

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [i for i, t in self.added_tokens_decoder.items()
                              if t.content and t.content in text]}


def read_tokenizer(path):
    """The target's tokenizer: full where tokenizer.json is present, else the
    special-token view; None where neither file is there."""
    path = Path(path)
    if (path / "tokenizer.json").exists():
        from dflash.data.prepare import load_tokenizer
        return load_tokenizer(path)
    conf = path / "tokenizer_config.json"
    if not conf.exists():
        return None
    try:
        return ConfigTokenizer(json.loads(conf.read_text()), conf)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{conf}: unreadable ({exc})") from exc
