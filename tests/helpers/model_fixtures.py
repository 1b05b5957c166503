"""The small files of real models the docs name: config.json and tokenizer_config.json
(special tokens, chat template), written from the models' public configs. No weights,
no vocabulary: what preflight reads, at the real sizes.
"""
from __future__ import annotations

import json
from pathlib import Path

_QWEN3_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                "<think>", "</think>"]
_QWEN3_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                      "<think>", "</think>", "<|fim_prefix|>", "<|fim_middle|>",
                      "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}
# ChatML as Qwen3 renders it (system turn, <think> blocks on the generation prompt)
_QWEN3_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}")
_LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + "
    "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")


def _qwen3(hidden, inter, layers, heads, kv=8):
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": hidden,
            "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": 128, "vocab_size": 151936,
            "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
            "torch_dtype": "bfloat16", "attention_bias": False, "hidden_act": "silu"}


def _llama31(hidden, inter, layers, heads, kv=8):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "vocab_size": 128256, "max_position_embeddings": 131072,
            "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
            "torch_dtype": "bfloat16", "attention_bias": False, "mlp_bias": False,
            "hidden_act": "silu", "head_dim": hidden // heads}


def _qwen3_tokenizer():
    added = {str(151643 + i): {"content": c, "special": c not in _QWEN3_NOT_SPECIAL}
             for i, c in enumerate(_QWEN3_ADDED)}
    return {"added_tokens_decoder": added, "bos_token": None, "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>", "chat_template": _QWEN3_TEMPLATE}


def _llama3_tokenizer():
    named = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128004: "<|finetune_right_pad_id|>",
             128006: "<|start_header_id|>", 128007: "<|end_header_id|>", 128008: "<|eom_id|>",
             128009: "<|eot_id|>", 128010: "<|python_tag|>"}
    added, reserved = {}, 0
    for i in range(128000, 128256):
        if i not in named:
            named[i] = f"<|reserved_special_token_{reserved}|>"
            reserved += 1
        added[str(i)] = {"content": named[i], "special": True}
    return {"added_tokens_decoder": added, "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>", "chat_template": _LLAMA3_TEMPLATE}


MODELS = {
    "Qwen3-8B": (_qwen3(4096, 12288, 36, 32), _qwen3_tokenizer),
    "Qwen3-32B": (_qwen3(5120, 25600, 64, 64), _qwen3_tokenizer),
    "Llama-3.1-8B": (_llama31(4096, 14336, 32, 32), _llama3_tokenizer),
    "Llama-3.1-70B": (_llama31(8192, 28672, 80, 64), _llama3_tokenizer),
}


def write_model(root: Path, name: str) -> Path:
    """`root/name/` with the model's config.json and tokenizer_config.json."""
    config, tokenizer = MODELS[name]
    d = Path(root) / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config, indent=1))
    (d / "tokenizer_config.json").write_text(json.dumps(tokenizer(), indent=1))
    return d
