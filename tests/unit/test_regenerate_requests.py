"""Which turns a regeneration asks for, with what prompt, and how replies come back."""
import json

import pytest

from dflash.errors import DataError
from dflash.decode import PromptLookupProposer
from dflash.generation.requests import (num_rounds, output_record, read_conversations,
                                        requests_for_round, split_reasoning)


def _write(tmp_path, lines):
    p = tmp_path / "in.jsonl"
    p.write_bytes(b"\n".join(x if isinstance(x, bytes) else json.dumps(x).encode() for x in lines) + b"\n")
    return p


CHAT = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                     {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}


def test_bad_lines_are_named_and_skipped_or_stop(tmp_path):
    p = _write(tmp_path, [CHAT, b"{not json", {"messages": [{"role": "system", "content": "x"}]},
                          b"\xff\xfe", {"conversations": CHAT["messages"]}])
    convs, skipped = read_conversations([p])
    assert len(convs) == 2 and [s["where"] for s in skipped] == [f"{p}:2", f"{p}:3", f"{p}:4"]
    assert "no assistant turn" in skipped[1]["reason"] and "UTF-8" in skipped[2]["reason"]
    with pytest.raises(DataError, match=rf"{p}:2: invalid JSON"):
        read_conversations([p], "error")


def test_each_turn_is_prompted_with_the_replies_regenerated_before_it(tmp_path):
    convs, _ = read_conversations([_write(tmp_path, [CHAT])])
    assert num_rounds(convs, "last") == 1 and num_rounds(convs, "each") == 2
    last = requests_for_round(convs, "last", 0)
    assert [r.turn for r in last] == [3] and last[0].messages[1]["content"] == "b"
    first = requests_for_round(convs, "each", 0)
    assert [r.turn for r in first] == [1] and len(first[0].messages) == 1
    convs[0].replies[1] = {"role": "assistant", "content": "B"}
    second = requests_for_round(convs, "each", 1)
    assert second[0].messages[1]["content"] == "B"  # the regenerated reply, not the data's
    results = {"0/1": {"finish_reason": "stop", "tokens": 3},
               "0/3": {"finish_reason": "length", "tokens": 5}}
    convs[0].replies[3] = {"role": "assistant", "content": "D"}
    rec = output_record(convs[0], "each", results)
    assert [m["content"] for m in rec["messages"]] == ["a", "B", "c", "D"]
    assert rec["finish_reason"] == "length" and rec["generated_tokens"] == 8
    assert rec["finish_reasons"] == ["stop", "length"]


def test_reasoning_goes_to_reasoning_content():
    assert split_reasoning("<think>\nlet me see\n</think>\n\n42") == {
        "role": "assistant", "content": "42", "reasoning_content": "let me see"}
    assert split_reasoning(" 42 ") == {"role": "assistant", "content": "42"}


def test_prompt_lookup_drafts_what_followed_the_last_match():
    p = PromptLookupProposer(block_size=4)
    assert p.draft([5, 6, 7, 8, 9, 5, 6]) == [7, 8, 9]
    assert p.draft([1, 2, 3]) == [3, 3, 3]  # no earlier match: repeat


def test_a_prompt_beyond_the_batch_token_budget_is_refused():
    from dflash.generation.requests import Request
    from dflash.generation.runner import plan_batches
    reqs = [Request(f"{i}/1", i, 1, f"f:{i}", [], prompt_ids=[1] * n) for i, n in enumerate([5, 50])]
    assert sorted(i for b in plan_batches(reqs, 10, 128, 4) for i in b) == [0, 1]
    with pytest.raises(DataError, match=r"batching.token_budget=32 is below one prompt \+ "
                                        r"max_new_tokens \(60 tokens\)"):
        plan_batches(reqs, 10, 32, 4)


def test_a_prompt_only_conversation_gets_its_reply_as_a_new_final_turn(tmp_path):
    prompt = {"id": 7, "messages": [{"role": "system", "content": "s"}, *CHAT["messages"],
                                    {"role": "user", "content": "e"}]}
    convs, skipped = read_conversations([_write(tmp_path, [prompt])])
    assert not skipped and num_rounds(convs, "each") == 3
    (req,) = requests_for_round(convs, "last", 0)
    assert req.turn == 6 and [m["content"] for m in req.messages] == ["s", "a", "b", "c", "d", "e"]
    convs[0].replies[6] = {"role": "assistant", "content": "F"}
    results = {"0/6": {"finish_reason": "stop", "tokens": 2, "prompt_ids": [1, 2], "ids": [5],
                       "stop_id": 9}}
    rec = output_record(convs[0], "last", results)
    assert rec["id"] == 7 and [m["role"] for m in rec["messages"]][-2:] == ["user", "assistant"]
    assert rec["messages"][-1]["content"] == "F"
    assert rec["token_ids"] == {"prompt": [1, 2], "reply": [5], "stop": 9, "template_kwargs": {}}


@pytest.mark.parametrize("override, named", [
    ("temperature=-1", "temperature=-1.0: must be 0"), ("top_p=1.5", "top_p=1.5"),
    ("max_new_tokens=0", "max_new_tokens=0: must be >= 1"), ("max_seq_len=64", "max_seq_len=64"),
    ("out={tmp}", "a directory; give a file"), ("tokenizer={tmp}", "cannot be loaded by transformers"),
])
def test_settings_and_a_tokenizer_that_cannot_work_are_refused_before_the_target_loads(
        tmp_path, override, named):
    """Each would have run the whole regeneration (an empty reply, a negative temperature
    read as greedy) or failed at its end (out= a directory) or in transformers' traceback
    (a model dir without tokenizer files); `tmp_path` holds no model, so only a refusal
    of the setting itself can pass."""
    from dflash.config import compose
    from dflash.errors import UserError
    from dflash.regenerate import run_regenerate
    cfg = compose("regenerate", ["inputs=[in.jsonl]", f"out={tmp_path}/o.jsonl",
                                 f"tokenizer={tmp_path}", "max_new_tokens=64",
                                 override.format(tmp=tmp_path)])
    with pytest.raises(UserError, match=named):
        run_regenerate(cfg, tmp_path)
