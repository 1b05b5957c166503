"""The engine speed client against a stand-in llama-server on loopback (answers as the real
one does: tokens and its own decode timings, a server per mode): tokens/s from the
engine's timings, speedups over no speculation as a ratio of sums with a paired interval,
the best n-gram mode named, outputs compared, 1 and 4 concurrent requests."""
import json
import re
import sys

import pytest
import torch
from safetensors.torch import save_file

from dflash.errors import DataError
from dflash.recipe.engine_speed import SpeedReport, load_prompts, main

SERVER = r'''
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
mode = args[args.index("--spec-type") + 1] if "--spec-type" in args else "none"
draft = args[args.index("--model-draft") + 1] if "--model-draft" in args else ""
# ms a token per mode; the "wrong" drafter changes the output (a lossy engine)
ms = {"none": 10.0, "ngram-simple": 8.0, "ngram-mod": 5.0, "draft-dflash": 4.0}[mode]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_GET(self): self._send({"status": "ok"})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = req["n_predict"]
        slot = int(args[args.index("-c") + 1]) // int(args[args.index("-np") + 1])
        if len(req["prompt"]) + n > slot or req["prompt"][0] == 63:  # as llama-server refuses
            body = json.dumps({"error": {"code": 400, "message": "the request exceeds the "
                               "available context size, try increasing it"}}).encode()
            self.send_response(400); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body); return
        toks = [req["prompt"][0]] * n if "lossy" not in draft else [0] * n
        acc = 0 if mode == "none" else n // 2
        self._send({"tokens": toks, "timings": {"predicted_n": n, "predicted_ms": ms * n * (1 + req["prompt"][0] % 2),
                    "draft_n": 2 * acc, "draft_n_accepted": acc}})
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''
CONVERT = "import sys; a = sys.argv; open(a[a.index('--outfile') + 1], 'w').write(' '.join(a[1:]))"


def _tree(tmp_path):
    tree = tmp_path / "llama.cpp"
    (tree / "build" / "bin").mkdir(parents=True)
    (tree / "convert_hf_to_gguf.py").write_text(CONVERT)
    server = tree / "build" / "bin" / "llama-server"
    server.write_text(f"#!{sys.executable}\n{SERVER}")
    server.chmod(0o755)
    return tree


def _drafter(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"],
                                               "dflash_config": {"block_size": 8}}))
    save_file({"fc.weight": torch.zeros(1)}, str(d / "model.safetensors"))
    return d


def _target(tmp_path, vocab=64):
    t = tmp_path / "t"
    t.mkdir(exist_ok=True)
    (t / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": vocab}))
    return t


def test_each_mode_timed_by_the_engine_against_no_speculation(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [i, 5]}) + "\n" for i in range(1, 7)))
    out = tmp_path / "speed.json"
    r = main(["--llama-cpp", str(_tree(tmp_path)), "--target", str(_target(tmp_path)), "--prompts",
              str(prompts), "--drafter", f"trained={_drafter(tmp_path, 'd')}", "--drafter",
              f"lossy={_drafter(tmp_path, 'wrong')}", "--ngram", "ngram-simple", "ngram-mod",
              "--max-new-tokens", "10", "--threads", "1", "--out", str(out),
              "--work", str(tmp_path / "w")])
    written = json.loads(out.read_text())
    assert written == r.to_json() and SpeedReport.from_json(written) == r
    assert "speedup" not in written["runs"][0]["modes"]["none"]  # the base: no ratio to itself
    assert [run.concurrency for run in r.runs] == [1, 4]
    for run in r.runs:
        m = run.modes
        assert list(m) == ["none", "ngram-simple", "ngram-mod", "trained", "lossy"]
        # 60 tokens in 10 ms a token, half the prompts at twice the time
        assert m["none"].tokens_per_second == pytest.approx(60 / 0.9)
        assert m["trained"].speedup["value"] == pytest.approx(10 / 4)
        assert m["trained"].speedup["lo"] <= 2.5 <= m["trained"].speedup["hi"]
        assert m["ngram-simple"].speedup["value"] == pytest.approx(10 / 8)
        assert run.best_ngram == "ngram-mod"
        assert m["trained"].outputs_equal == 6 and m["lossy"].outputs_equal == 0
        assert m["trained"].acceptance_length == pytest.approx(60 / 30)
        assert m["none"].acceptance_length == 1


def test_prompts_from_an_eval_report_or_named_where_they_are_missing(tmp_path):
    rep = tmp_path / "eval.json"
    rep.write_text(json.dumps({"prompt_ids": [[1, 2], [3]], "tokens": [[4], [5]]}))
    assert load_prompts(rep, 0) == [[1, 2], [3]] and load_prompts(rep, 1) == [[1, 2]]
    one = tmp_path / "one.jsonl"  # a one-line JSONL is a JSON document too: one prompt
    one.write_text(json.dumps({"prompt_ids": [7, 8]}) + "\n")
    assert load_prompts(one, 0) == [[7, 8]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt_ids": [1]}) + "\n" + json.dumps({"text": "hi"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: no 'prompt_ids'"):
        load_prompts(bad, 0)


@pytest.mark.parametrize("prompts, drafter, named", [
    ('{"prompt_ids": [1, 2]}\nnot json\n', "d", r"p.jsonl:2: invalid JSON"),
    ('{"prompt_ids": ["a", 2]}\n', "d", r"p.jsonl:1: 'prompt_ids' must be a non-empty list"),
    ('{"prompt_ids": [[1], 5]}', "d", r"p.jsonl: prompt_ids\[1\] must be"),  # an eval report
    ('{"prompt_ids": [1, 64]}\n', "d", r"prompt 0 holds token id 64, outside .* of 64"),
    ('{"prompt_ids": [1, 2]}\n', "none", r"--drafter x=.*none: drafter checkpoint .*none: no such directory"),
])
def test_bad_prompts_or_drafters_are_refused_in_one_line_before_any_conversion(
        tmp_path, capsys, prompts, drafter, named):
    p = tmp_path / "p.jsonl"
    p.write_text(prompts)
    _drafter(tmp_path, "d")
    work = tmp_path / "w"
    with pytest.raises(SystemExit) as e:
        main(["--llama-cpp", str(_tree(tmp_path)), "--target", str(_target(tmp_path)),
              "--prompts", str(p), "--drafter", f"x={tmp_path / drafter}", "--work", str(work)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "Traceback" not in err[0]
    assert re.search(named, err[0]), err
    assert not list(work.glob("*.gguf"))  # refused before the target was converted


def test_a_prompt_longer_than_a_default_slot_is_served_and_a_refusal_is_one_line(tmp_path, capsys):
    """Each slot's context is sized to the longest prompt and its new tokens; a request the
    server still refuses ends the run with the server's own reason, not a traceback."""
    tree, target = _tree(tmp_path), _target(tmp_path)

    def run(prompt):
        p = tmp_path / "p.jsonl"
        p.write_text(json.dumps({"prompt_ids": prompt}) + "\n")
        return main(["--llama-cpp", str(tree), "--target", str(target),
                     "--prompts", str(p), "--ngram", "--concurrency", "2", "--max-new-tokens",
                     "8", "--out", str(tmp_path / "s.json"), "--work", str(tmp_path / "w")])
    r = run([1] * 5000)  # past 4096 tokens
    assert r.runs[0].modes["none"].tokens_per_second > 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run([63, 1])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert "refused a prompt of 2 tokens" in err[0] and "exceeds the available context" in err[0]
