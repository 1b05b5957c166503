"""The target families users bring, built tiny and locally: each from its own transformers
config class, with a byte-level tokenizer carrying the family's real chat template (the
files in tests/fixtures/chat_templates/ are the models' published templates, as llama.cpp
ships them in models/templates/) and the family's own special tokens."""
from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
VOCAB = 320  # 256 bytes + the family's specials, padded

_QWEN = dict(specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                       "<tool_call>", "</tool_call>"],
             bos=None, eos="<|im_end|>", pad="<|endoftext|>")
FAMILIES = {
    # name: (config class, extra config keys, template file, tokenizer specials)
    "qwen3": ("Qwen3Config", {}, "Qwen-Qwen3-0.6B.jinja", _QWEN),
    "qwen2.5": ("Qwen2Config", {}, "Qwen-Qwen2.5-7B-Instruct.jinja", _QWEN),
    "llama3.1": ("LlamaConfig", {}, "meta-llama-Llama-3.1-8B-Instruct.jinja",
                 dict(specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>",
                                "<|finetune_right_pad_id|>"],
                      bos="<|begin_of_text|>", eos="<|eot_id|>", pad="<|finetune_right_pad_id|>")),
    "mistral": ("MistralConfig", {"sliding_window": 64},
                "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                dict(specials=["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]",
                               "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                               "[/TOOL_RESULTS]", "<pad>"],
                     bos="<s>", eos="</s>", pad="<pad>")),
    # sliding-window layers (window 8 of a longer context) and scaled embeddings
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": 8},
               "google-gemma-2-2b-it.jinja",
               dict(specials=["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
                    bos="<bos>", eos="<end_of_turn>", pad="<pad>")),
    "phi3": ("Phi3Config", {}, "microsoft-Phi-3.5-mini-instruct.jinja",
             dict(specials=["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
                  bos=None, eos="<|end|>", pad="<|endoftext|>")),
    "qwen3-moe": ("Qwen3MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2,
                                     "moe_intermediate_size": 32},
                  "Qwen-Qwen3-0.6B.jinja", _QWEN),
}
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)


def build_tokenizer(name: str, out: Path):
    """A byte-level BPE tokenizer (every text encodes, no merges) with the family's
    special tokens and real chat template, saved in `out`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    spec = FAMILIES[name][3]
    byte_map = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_map))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=spec["bos"],
                                   eos_token=spec["eos"], pad_token=spec["pad"])
    fast.add_special_tokens({"additional_special_tokens":
                             [s for s in spec["specials"] if s not in (spec["bos"], spec["eos"], spec["pad"])]})
    fast.chat_template = (TEMPLATES / FAMILIES[name][2]).read_text()
    assert len(fast) <= VOCAB
    fast.save_pretrained(out)
    return fast


def build_target(name: str, out: Path, seed: int = 0) -> Path:
    """The family's tiny causal LM and its tokenizer in `out` (an HF model dir)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    cls, extra, _, spec = FAMILIES[name]
    tok = build_tokenizer(name, out)
    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
               bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else tok.pad_token_id)
    hc = getattr(transformers, cls)(**COMMON, **extra, **ids)
    torch.manual_seed(seed)
    lm = AutoModelForCausalLM.from_config(hc)
    with torch.no_grad():  # rows past the tokenizer are never predicted, as in a trained model
        lm.get_output_embeddings().weight[len(tok):] *= 1e-3
    lm.save_pretrained(out)
    return out
