"""The loss mask on real tokenizers built locally: exactly the assistant tokens and the
token closing each turn, for byte-level BPE + ChatML, SentencePiece-style + Llama-2 and a
Qwen3-style template that strips past reasoning."""
import json


from dflash.data.prepare import prepare

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
