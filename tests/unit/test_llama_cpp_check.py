"""The llama.cpp check's client: a stand-in llama.cpp tree (its converter writes the file,
its llama-server answers on loopback as the real one does: tokens, draft timings), so the
conversion calls, the server's life and the acceptance arithmetic are tested without a
C++ build. The real server was checked by hand (docs/real-model.md)."""
import json
import sys

import pytest

from dflash.errors import ConfigError
from dflash.recipe.llama_cpp import ServingCheck, check, format_check, llama_cpp_tree, pooled
from dflash.eval.report import EvalReport

SERVER = r'''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
assert args[args.index("--spec-type") + 1] == "draft-dflash"
answers = json.load(open(__file__ + ".json"))
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_GET(self): self._send({"status": "ok"})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        a = answers[str(req["prompt"][0])]
        self._send({"tokens": a["tokens"][:req["n_predict"]],
                    "timings": {"draft_n": 7 * a["steps"], "draft_n_accepted": a["accepted"]}})
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''
CONVERT = "import sys; a = sys.argv; open(a[a.index('--outfile') + 1], 'w').write(' '.join(a[1:]))"


def _tree(tmp_path, answers):
    tree = tmp_path / "llama.cpp"
    (tree / "build" / "bin").mkdir(parents=True)
    (tree / "convert_hf_to_gguf.py").write_text(CONVERT)
    server = tree / "build" / "bin" / "llama-server"
    server.write_text(f"#!{sys.executable}\n{SERVER}")
    server.chmod(0o755)
    (tree / "build" / "bin" / "llama-server.json").write_text(json.dumps(answers))
    return tree


@pytest.mark.parametrize("llama_accepted,within_final_step", [(2, True), (1, True), (0, False)])
def test_the_check_converts_serves_and_compares_prompt_by_prompt(
        tmp_path, llama_accepted, within_final_step):
    # dflash's report: prompt 1 took 8 steps for 10 tokens (2 drafts accepted, 1 of them
    # in its final step), prompt 2 5 steps for 5; llama.cpp answers prompt 1 alike
    # (counting 2, 1 or 0 accepted drafts) and prompt 2 with other tokens
    report = EvalReport.from_json(
        {"drafter": "d", "prompt_ids": [[1, 9], [2, 9]], "tokens": [list(range(10)), [5, 5, 5, 5, 5]],
         "per_prompt": [10 / 8, 1.0], "per_prompt_steps": [8, 5],
         "per_prompt_last_step_accepted": [1, 0]})
    tree = _tree(tmp_path, {"1": {"tokens": list(range(10)), "steps": 8, "accepted": llama_accepted},
                            "2": {"tokens": [5, 5, 6, 6, 6], "steps": 4, "accepted": 1}})
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"dflash_config": {"block_size": 8}}))
    out = check(llama_cpp_tree(str(tree)), tmp_path / "target", drafter, report, tmp_path / "gguf",
                threads=1, timeout=60)
    assert out.prompts == 2 and out.equal_tokens == 1 and out.block_size == 8
    assert out.dflash == pytest.approx(15 / 13)
    assert out.llama_cpp == pytest.approx(15 / (15 - llama_accepted - 1))
    assert out.to_json()["equal_prompts"] == {
        "llama_cpp": 10 / (10 - llama_accepted), "dflash": 10 / 8,
        "same_accepted_per_prompt": llama_accepted == 2,
        "differences_only_in_final_step": within_final_step}
    assert ServingCheck.from_json(json.loads(json.dumps(out.to_json()))) == out
    said = format_check(out)
    assert ("within the final verify step" in said) == (llama_accepted != 2)
    # the drafter converted with the target's vocabulary, both to f32
    assert "--target-model-dir" in (tmp_path / "gguf" / "drafter.gguf").read_text()
    assert "--outtype f32" in (tmp_path / "gguf" / "target.gguf").read_text()
    assert pooled(10, 2) == 10 / 8


def test_a_tree_without_a_built_server_is_refused_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.delenv("LLAMA_CPP_DIR", raising=False)
    assert llama_cpp_tree(None) is None
    (tmp_path / "convert_hf_to_gguf.py").write_text("")
    with pytest.raises(ConfigError, match=r"llama_cpp=.*: no build/bin/llama-server there"):
        llama_cpp_tree(str(tmp_path))
    monkeypatch.setenv("LLAMA_CPP_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="no build/bin/llama-server"):
        llama_cpp_tree(None)


def test_a_server_that_exits_at_start_is_one_line_with_its_own_reason(tmp_path):
    from dflash.errors import ToolError
    from dflash.recipe.llama_cpp import serving
    tree = tmp_path / "llama.cpp"
    (tree / "build" / "bin").mkdir(parents=True)
    server = tree / "build" / "bin" / "llama-server"
    server.write_text("#!/bin/sh\necho 'loading model'\n"
                      "echo \"llama_model_load: error loading model: unknown model architecture: 'x'\"\n"
                      "exit 1\n")
    server.chmod(0o755)
    log = tmp_path / "server.log"
    with pytest.raises(ToolError, match=r"exited with status 1 before it was ready \(.*server.log\): "
                                        r"llama_model_load: error loading model: unknown model "
                                        r"architecture: 'x'$"):
        with serving(tree, tmp_path / "t.gguf", [], log, timeout=30):
            pass
