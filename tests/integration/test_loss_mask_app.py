"""The loss mask on real tokenizers built locally: exactly the assistant tokens and the
token closing each turn, for byte-level BPE + ChatML, SentencePiece-style + Llama-2 and a
Qwen3-style template that strips past reasoning."""
import json

import pytest

from dflash.data.prepare import prepare

CORPUS = ["Is it 4? Yes. The answer is 4.", "I am a helpful assistant. OK.", "Hello world B or C?",
          "think step by step: two plus two is four", "user assistant system [INST] [/INST]",
          "<think>\n reasoning \n</think>\n\n Sure, here you go."] * 20

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA2 = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
          "[INST] {{ m['content'].strip() }} [/INST]{% elif m['role'] == 'assistant' %}"
          " {{ m['content'].strip() }} {{ eos_token }}{% endif %}{% endfor %}")
# the shape of Qwen3's template: reasoning kept only after the last user turn
QWEN3 = (
    "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m['role'] == 'user' %}"
    "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{%- if m['role'] != 'assistant' %}"
    "{{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{%- else %}{%- set content = m['content'] %}{%- set reasoning = '' %}"
    "{%- if m.reasoning_content is defined and m.reasoning_content %}"
    "{%- set reasoning = m.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last %}"
    "{{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content }}"
    "{%- else %}{{- '<|im_start|>assistant\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")


def _byte_bpe(template):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", additional_special_tokens=specials[1:])
    fast.chat_template = template
    return fast


def _sentencepiece(template):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Metaspace()
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400,
                                                       special_tokens=["<unk>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.chat_template = template
    return fast


TOKENIZERS = {"chatml-bpe": (_byte_bpe, CHATML, "<|im_end|>"),
              "llama2-sentencepiece": (_sentencepiece, LLAMA2, "</s>"),
              "qwen3-reasoning": (_byte_bpe, QWEN3, "<|im_end|>")}


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def tokenizer(request, tmp_path_factory):
    build, template, eot = TOKENIZERS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    build(template).save_pretrained(path)
    from transformers import AutoTokenizer
    return request.param, path, AutoTokenizer.from_pretrained(str(path)), eot


CONVERSATIONS = [
    [{"role": "user", "content": "Is it 4? Yes."}, {"role": "assistant", "content": "Yes."}],
    [{"role": "system", "content": "Say 4 or B. OK."}, {"role": "user", "content": "Is it 4?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "B or C? OK."},
     {"role": "assistant", "content": "OK. \n"}],
    [{"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "<think>\ntwo plus two\n</think>\n\nI am four."},
     {"role": "user", "content": "Sure?"},
     {"role": "assistant", "content": "<think>\nthink step by step\n</think>\n\nYes. I am."}],
    [{"role": "user", "content": "Hello world"},
     {"role": "assistant", "content": "Sure, here you go.", "reasoning_content": "the answer"}],
]


def _chat_line(user, reply):
    return json.dumps({"messages": [{"role": "user", "content": user},
                                    {"role": "assistant", "content": reply}]}).encode() + b"\n"


def test_bad_lines_are_skipped_and_reported_with_file_and_line(tmp_path, chat_tokenizer):
    from tests.helpers.run import run_module
    f = tmp_path / "c.jsonl"
    latin1 = b'{"messages": [{"role": "user", "content": "w\xff1"}]}\n'
    f.write_bytes(_chat_line("w1", "w2") + latin1 + b"{oops\n" + _chat_line("w1", "")
                  + _chat_line("w3", "w4 w5"))
    ds, summary = prepare(f, chat_tokenizer, tmp_path / "out")
    assert len(ds) == 2 and summary["skipped_lines"] == 3
    col = latin1.index(b"\xff") + 1
    assert summary["skipped"][0] == f"{f}:2: not valid UTF-8 (byte 0xff at column {col})"
    assert summary["skipped"][1].startswith(f"{f}:3: invalid JSON")
    assert summary["skipped"][2] == f"{f}:4: no assistant content, nothing to supervise"
    assert json.loads((tmp_path / "out" / "prepare_report.json").read_text()) == summary
    p = run_module("dflash.data.prepare", "--jsonl", str(f), "--tokenizer", str(chat_tokenizer),
                   "--out", str(tmp_path / "e"), "--bad-lines", "error", check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"dflash: error: {f}:2: not valid UTF-8" in p.stderr
