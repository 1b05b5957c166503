"""Chat records as they are published: ShareGPT, OpenAI / UltraChat messages (text parts,
tool calls, reasoning) map to one message list; what cannot be mapped is refused naming
the line."""
import json

import pytest

from dflash.data.chat_formats import record_messages
from dflash.data.prepare import prepare
from dflash.errors import DataError

TEXT = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3 w4"},
        {"role": "assistant", "content": "w5 w6 w7"}]


def test_sharegpt_maps_to_the_same_messages_as_openai():
    share = {"conversations": [{"from": "system", "value": "w1 w2"}, {"from": "human", "value": "w3 w4"},
                               {"from": "gpt", "value": "w5 w6 w7"}], "id": "a"}
    assert record_messages(share, "f:1") == TEXT
    assert record_messages({"messages": TEXT}, "f:1") == TEXT


def test_openai_parts_tool_calls_and_reasoning_are_kept_for_the_template():
    call = {"id": "c1", "type": "function", "function": {"name": "w8", "arguments": "{}"}}
    rec = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "w3 "}, {"type": "text", "text": "w4"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "w9"},
        {"role": "assistant", "content": "w5", "reasoning": "w6 w7"}]}
    out = record_messages(rec, "f:1")
    assert out[0] == {"role": "user", "content": "w3 w4"}
    assert out[1]["tool_calls"] == [call] and out[1]["content"] == ""
    assert out[2] == {"role": "tool", "tool_call_id": "c1", "content": "w9"}
    assert out[3]["reasoning_content"] == "w6 w7"


@pytest.mark.parametrize("rec, named", [
    ({"conversations": [{"from": "robot", "value": "x"}]}, "from='robot'"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "'image_url' content part"),
    ({"messages": [{"role": "narrator", "content": "x"}]}, "role='narrator'"),
    ({"text": "x"}, "no 'messages' or 'conversations' list (keys: text)"),
    # content parts that are not part objects, or a text part whose text is not a string
    ({"messages": [{"role": "user", "content": ["x"]}]}, "content part of type str"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]},
     "'text' is of type int"),
])
def test_a_format_that_cannot_be_mapped_is_refused_naming_the_line(rec, named):
    with pytest.raises(DataError, match="^f.jsonl:7: ") as e:
        record_messages(rec, "f.jsonl:7")
    assert named in str(e.value)


def test_prepare_reads_sharegpt_and_openai_records_alike(tmp_path, chat_tokenizer):
    rows = [{"messages": TEXT},
            {"conversations": [{"from": "system", "value": "w1 w2"}, {"from": "human", "value": "w3 w4"},
                               {"from": "gpt", "value": "w5 w6 w7"}]},
            {"conversations": [{"from": "robot", "value": "w1"}]}]
    src = tmp_path / "mixed.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds, summary = prepare(src, chat_tokenizer, tmp_path / "out")
    assert len(ds) == 2 and summary["skipped_lines"] == 1
    a, b = ds.sample(0), ds.sample(1)
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()  # the same tokens and mask
