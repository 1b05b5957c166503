"""The drafter's default mask token: an embedding row the tokenizer never emits.

The block input [anchor, MASK x 15] needs a token id that real text never holds, or
every draft is ambiguous (and a serving engine must use the same id). The last embedding
row is such a row only when the vocabulary is padded past the tokenizer: SmolLM2's last
row (49151) is a word its tokenizer emits. So, in order:
1. the first row past the tokenizer (Qwen3: 151669, the id the public drafters use);
2. the highest reserved special token that no chat turn renders (not bos/eos/pad/unk,
   not in a probe conversation rendered with the chat template);
3. the last row (no tokenizer known: the synthetic sets, which never use it).
Whatever is chosen is then checked against the data set (`TokenDataset.check_absent`).
"""
from __future__ import annotations


def default_mask_token(vocab_size: int, tok=None) -> int:
    if tok is None:
        return int(vocab_size) - 1
    if len(tok) < vocab_size:
        return len(tok)
    used = rendered_tokens(tok)
    reserved = [i for i, t in tok.added_tokens_decoder.items()
                if t.special and i not in used and i < vocab_size]
    return max(reserved) if reserved else int(vocab_size) - 1


def rendered_tokens(tok) -> set:
    """Ids a chat turn renders: bos/eos/pad/unk and every token of a probe conversation
    through the chat template (a mask token must be none of them)."""
    used = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}
    try:
        probe = tok.apply_chat_template(
            [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
             {"role": "assistant", "content": "a"}], tokenize=False, add_generation_prompt=True)
        used |= set(tok(probe, add_special_tokens=False)["input_ids"])
    except Exception:  # noqa: BLE001  (no template, or one that refuses the probe)
        pass
    return used - {None}
