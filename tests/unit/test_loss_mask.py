"""The loss mask on real tokenizers built locally: exactly the assistant tokens and the
token closing each turn, for byte-level BPE + ChatML, SentencePiece-style + Llama-2 and a
Qwen3-style template that strips past reasoning."""
import json

import numpy as np
import pytest

from dflash.data.prepare import prepare
from dflash.errors import DataError

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


def _expected_runs(name, conv, eot):
    """What serving generates for each assistant turn, whitespace aside."""
    last_user = max(i for i, m in enumerate(conv) if m["role"] == "user")
    runs = []
    for i, m in enumerate(conv):
        if m["role"] != "assistant":
            continue
        content = m["content"]
        reasoning = m.get("reasoning_content", "")
        if "</think>" in content:
            reasoning, content = content.split("</think>")
            reasoning = reasoning.replace("<think>", "")
        if name.startswith("qwen3"):
            think = f"<think>{reasoning}</think>" if i > last_user else ""  # may be empty
        else:  # the other templates render content as given (reasoning tags included)
            think = m["content"].split("</think>")[0] + "</think>" if "</think>" in m["content"] else ""
        runs.append("".join((think + content + eot).split()))
    return runs


def _runs(mask):
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[::2], edges[1::2]))


def test_mask_covers_exactly_the_assistant_tokens_and_end_of_turn(tmp_path, tokenizer):
    name, path, tok, eot = tokenizer
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    ds, summary = prepare(f, path, tmp_path / "out", bad_lines="error")
    assert summary["samples"] == len(CONVERSATIONS) and summary["skipped_lines"] == 0
    for k, conv in enumerate(CONVERSATIONS):
        ids, mask = ds.sample(k)
        runs = _runs(mask)
        got = ["".join(tok.decode(ids[a:b].tolist()).split()) for a, b in runs]
        assert got == _expected_runs(name, conv, eot), (name, k)
        # each run begins right where the model starts generating that turn
        turns = [j for j, m in enumerate(conv) if m["role"] == "assistant"]
        for (a, _), j in zip(runs, turns):
            head = tok.apply_chat_template(conv[:j], tokenize=False,
                                           add_generation_prompt=not name.startswith("llama"))
            before = tok.decode(ids[:a].tolist())
            assert "".join(before.split()) == "".join(head.split()), (name, k, j)


def _chat_line(user, reply):
    return json.dumps({"messages": [{"role": "user", "content": user},
                                    {"role": "assistant", "content": reply}]}).encode() + b"\n"


def test_truncation_that_removes_every_supervised_token_is_counted(tmp_path, chat_tokenizer):
    f = tmp_path / "c.jsonl"
    f.write_bytes(_chat_line(" ".join(["w1"] * 30), "w2 w3") + _chat_line("w1", "w2"))
    ds, s = prepare(f, chat_tokenizer, tmp_path / "out", max_seq_len=20, overlong="truncate")
    assert len(ds) == 1 and s["overlong_samples"] == 1 and s["dropped_unsupervised"] == 1
    # the whole dropped sample is removed: 30 prompt words, 2 reply words, 6 template tokens
    assert s["tokens_removed"] == 30 + 2 + 6
    assert s["tokens"] == int(ds.lengths.sum())


def test_a_reply_the_template_never_renders_is_a_named_error(tmp_path, chat_tokenizer):
    import shutil
    from transformers import AutoTokenizer
    odd = tmp_path / "odd"
    shutil.copytree(chat_tokenizer, odd)
    tok = AutoTokenizer.from_pretrained(str(odd))
    tok.chat_template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} "
                         "{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %} <|im_end|> "
                         "{% endfor %}")
    tok.save_pretrained(odd)
    f = tmp_path / "c.jsonl"
    f.write_bytes(_chat_line("w1", "w2"))
    with pytest.raises(DataError, match=r"c.jsonl:1: assistant message 1 does not appear"):
        prepare(f, odd, tmp_path / "out", bad_lines="error")


def test_a_reply_cut_at_max_new_tokens_never_teaches_an_end_of_turn(tmp_path, tokenizer):
    name, path, tok, eot = tokenizer
    conv = CONVERSATIONS[1]  # two assistant turns
    rows = [{"messages": conv, "finish_reason": "stop"},
            {"messages": conv, "finish_reason": "length"},  # turns=last: the last was cut
            {"messages": conv, "finish_reasons": ["length", "stop"]}]  # turns=each
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds, _ = prepare(f, path, tmp_path / "out", bad_lines="error")
    closes = lambda k: ["".join(tok.decode(ds.sample(k)[0][a:b].tolist()).split()).endswith(eot)  # noqa: E731
                        for a, b in _runs(ds.sample(k)[1])]
    assert closes(0) == [True, True]
    assert closes(1) == [True, False] and closes(2) == [False, True]


def test_regenerated_replies_are_the_target_ids_and_teacher_forcing_gives_them_back(
        tmp_path, tokenizer):
    """A local target's greedy replies, as `dflash.regenerate` writes them (token_ids),
    prepared: the target teacher-forced over each sample picks every supervised token
    itself. The reply's text re-tokenized is another token sequence."""
    import torch
    from tests.helpers.models import tiny_target
    name, path, tok, eot = tokenizer
    target = tiny_target(vocab_size=len(tok)).eval()
    stop = tok.convert_tokens_to_ids(eot)
    rows, retokenized_differs = [], 0
    for k, user in enumerate(["Is it 4?", "Hello world", "two plus two"]):
        msgs = [{"role": "user", "content": user}]
        prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        out = target.lm.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                 eos_token_id=stop, pad_token_id=0)[0, len(ids):].tolist()
        reply, cut = (out[:out.index(stop)], False) if stop in out else (out, True)
        text = tok.decode(reply)
        retokenized_differs += tok(text, add_special_tokens=False)["input_ids"] != reply
        rows.append({"messages": [*msgs, {"role": "assistant", "content": text or "x"}],
                     "finish_reason": "length" if cut else "stop",
                     "token_ids": {"prompt": ids, "reply": reply, "stop": None if cut else stop}})
    f = tmp_path / "r.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds, _ = prepare(f, path, tmp_path / "out", bad_lines="error")
    for k, row in enumerate(rows):
        ids, mask = ds.sample(k)
        t = row["token_ids"]
        assert ids.tolist() == t["prompt"] + t["reply"] + ([t["stop"]] if t["stop"] else [])
        sup = np.flatnonzero(mask)
        assert sup.tolist() == list(range(len(t["prompt"]), len(ids)))
        logits = target.lm(torch.tensor(ids)[None]).logits[0]
        assert (logits[sup - 1].argmax(-1).numpy() == ids[sup]).all()
    assert retokenized_differs  # what text round trips would have trained on instead
    bad = dict(rows[0], token_ids=dict(rows[0]["token_ids"], prompt=[1, 2, 3]))
    f.write_text(json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=r"r.jsonl:1: token_ids.prompt is not what"):
        prepare(f, path, tmp_path / "out2", bad_lines="error")
