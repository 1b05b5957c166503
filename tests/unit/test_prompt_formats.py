"""Benchmark files (GSM8K, HumanEval, MT-Bench, chat JSONL) as prompts for eval and
regenerate, worded as the public DFlash benchmarks prompt them."""
import json

import pytest

from dflash.data.prompt_formats import as_chat
from dflash.errors import DataError
from dflash.eval.prompts import load_prompts
from dflash.generation.requests import num_rounds, read_conversations, requests_for_round

ROWS = {
    "gsm8k": [{"question": "w1 w2 w3", "answer": "#### 4"}],
    "humaneval": [{"task_id": "HumanEval/0", "prompt": "w4 w5", "test": "w6"}],
    "mtbench": [{"question_id": 81, "category": "writing", "turns": ["w7 w8", "w9"]}],
    "chat": [{"messages": [{"role": "user", "content": "w10"}, {"role": "assistant", "content": "w11"}]}],
}


def _file(tmp_path, fmt, rows):
    p = tmp_path / f"{fmt}.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_each_format_becomes_the_public_benchmarks_prompt():
    g = as_chat(ROWS["gsm8k"][0], "gsm8k", "f:1")["messages"]
    assert g == [{"role": "user", "content": "w1 w2 w3\nPlease reason step by step, and put "
                  "your final answer within \\boxed{}."}]
    h = as_chat(ROWS["humaneval"][0], "humaneval", "f:1")
    assert h["task_id"] == "HumanEval/0" and h["messages"][0]["content"].endswith(
        "passes the tests:\n```python\nw4 w5\n```")
    m = as_chat(ROWS["mtbench"][0], "mtbench", "f:1")["messages"]
    assert [x["role"] for x in m] == ["user", "assistant", "user"] and m[1]["content"] == ""
    with pytest.raises(DataError, match=r"f:3: a gsm8k record needs a non-empty string 'question'"):
        as_chat({"prompt": "x"}, "gsm8k", "f:3")
    with pytest.raises(DataError, match=r"f:2: an MT-Bench record needs 'turns'"):
        as_chat({"turns": "x"}, "mtbench", "f:2")


def test_eval_renders_each_format_through_the_chat_template(tmp_path, chat_tokenizer):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(chat_tokenizer))
    for fmt, rows in ROWS.items():
        (ids,) = load_prompts(_file(tmp_path, fmt, rows), fmt=fmt, tokenizer=tok)
        text = tok.decode(ids)
        assert text.rstrip().endswith("assistant"), (fmt, text)  # the generation prompt
    chat_text = tok.decode(load_prompts(_file(tmp_path, "chat", ROWS["chat"]), fmt="chat",
                                        tokenizer=tok)[0])
    assert "w10" in chat_text and "w11" not in chat_text  # the reply is not in the prompt
    mt_text = tok.decode(load_prompts(_file(tmp_path, "mtbench", ROWS["mtbench"]), fmt="mtbench",
                                      tokenizer=tok)[0])
    assert "w7" in mt_text and "w9" not in mt_text  # the first turn
    with pytest.raises(DataError, match="tokenizer=DIR"):
        load_prompts(_file(tmp_path, "gsm8k", ROWS["gsm8k"]), fmt="gsm8k")


def test_regenerate_reads_benchmark_files_as_prompt_only_conversations(tmp_path):
    convs, skipped = read_conversations([_file(tmp_path, "gsm8k", ROWS["gsm8k"] + [{"q": 1}])],
                                        fmt="gsm8k")
    assert len(convs) == 1 and "needs a non-empty string 'question'" in skipped[0]["reason"]
    (req,) = requests_for_round(convs, "last", 0)
    assert req.turn == 1 and req.messages[0]["content"].startswith("w1 w2 w3\nPlease reason")
    mt, _ = read_conversations([_file(tmp_path, "mtbench", ROWS["mtbench"])], fmt="mtbench")
    assert num_rounds(mt, "each") == 2  # each turn's reply regenerated in order


def test_the_prompt_set_is_seeded_mixed_checkable_and_regenerate_reads_it(tmp_path):
    import re
    from dflash.recipe.prompt_gen import prompt_set, write_prompts
    path = write_prompts(25, tmp_path / "p.jsonl", seed=3)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert rows == prompt_set(25, 3) != prompt_set(25, 4)
    assert {r["kind"] for r in rows} == {"arithmetic", "rewrite", "list", "explain", "code"}
    for r in prompt_set(200, 5):
        if r["kind"] != "arithmetic":
            continue
        text = r["messages"][0]["content"]
        nums = [int(x) for x in re.findall(r"\d+", text)]
        if "buys" in text and "more" in text:
            assert int(r["answer"]) == nums[0] + nums[1] - nums[2]
        elif "boxes" in text:
            assert int(r["answer"]) == nums[0] * nums[1]
        elif "shares" in text:
            assert int(r["answer"]) * nums[1] == nums[0]
        elif "change" in text:
            assert int(r["answer"]) == nums[2] - nums[0] * nums[1] > 0
        else:
            assert "km per hour" in text and int(r["answer"]) == nums[0] * nums[1]
    convs, skipped = read_conversations([path])
    assert len(convs) == 25 and not skipped  # prompts only: each gets its reply as a final turn
    assert all(c.messages[-1] == {"role": "assistant", "content": ""} for c in convs)


def test_the_generator_cli_writes_a_split_and_refuses_an_unknown_one(tmp_path, capsys):
    from dflash.recipe.prompt_gen import main, prompt_set, subjects
    main(["--n", "10", "--out", str(tmp_path / "h.jsonl"), "--split", "heldout"])
    rows = [json.loads(x) for x in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert rows == prompt_set(10, 0, split="heldout") != prompt_set(10, 0, split="train")
    with pytest.raises(ValueError, match="split must be one of"):
        subjects("test")


def test_a_prompt_set_repeats_no_prompt_and_a_kind_that_runs_out_gives_way():
    """A repeated prompt is a repeated greedy reply; 5,000 training-split prompts ask
    1,000 of each kind, more than its code tasks hold: arithmetic takes the rest,
    still distinct."""
    from collections import Counter
    from dflash.recipe.prompt_gen import prompt_set
    rows = prompt_set(5000, 0, split="train")
    texts = [r["messages"][0]["content"] for r in rows]
    assert len(set(texts)) == 5000
    kinds = Counter(r["kind"] for r in rows)
    assert kinds["code"] < 1000 < kinds["arithmetic"] and sum(kinds.values()) == 5000
    assert [r["kind"] for r in rows[:100]] == ["arithmetic", "rewrite", "list", "explain",
                                                "code"] * 20  # in turn while none ran out
    held = prompt_set(50, 1, exclude=set(texts))
    assert not {r["messages"][0]["content"] for r in held} & set(texts)
