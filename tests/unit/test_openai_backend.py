"""The OpenAI-compatible backend against the reply shapes servers really send: a real
HTTP server on loopback answers each prompt with another server's shape."""
import json
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import pytest

from dflash.decode.backend import Sampling
from dflash.decode.server import OpenAIBackend
from dflash.errors import ConfigError, DataError
from tests.helpers.http import send_json, serving

MESSAGE = {"role": "assistant", "content": "the answer"}
# the prompt -> what the server puts in its reply's choices
CHOICES = {
    "sglang": [{"index": 0, "finish_reason": "stop",
                "message": {**MESSAGE, "reasoning_content": "thought a"}}],
    "vllm": [{"index": 0, "finish_reason": "length",  # newer vLLM: `reasoning`
              "message": {**MESSAGE, "reasoning": "thought b"}}],
    "gateway": [{"index": 0, "finish_reason": "max_tokens", "message": MESSAGE}],
    "filtered": [],  # a content filter's reply: no choice at all
    "null": None,
    "no message": [{"index": 0, "finish_reason": "stop", "message": None}],
    # a filter cut the reply short: not what the target writes
    "content filter": [{"index": 0, "finish_reason": "content_filter", "message": MESSAGE}],
}


class _WordCounter:
    """A tokenizer's call shape: one id a word."""
    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": list(range(len(text.split())))}


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        send_json(self, {"id": "x", "object": "chat.completion", "created": 0,
                         "model": body["model"], "choices": CHOICES[body["messages"][-1]["content"]]})


def _backend(port, model="m", tokenizer=None):
    return OpenAIBackend(SimpleNamespace(
        base_url=f"http://127.0.0.1:{port}/v1", model=model, api_key_env="NONE",
        concurrency=2, timeout=10, retries=0), Sampling(max_new_tokens=8), tokenizer=tokenizer)


def test_reasoning_under_either_name_and_a_reply_without_a_choice_is_a_failed_request():
    with serving(_Handler) as port:
        backend = _backend(port, tokenizer=_WordCounter())
        reqs = [SimpleNamespace(key=k, messages=[{"role": "user", "content": k}]) for k in CHOICES]
        out = {r["key"]: r for r in backend.generate(reqs)}
    assert out["sglang"]["reasoning"] == "thought a" and out["sglang"]["finish_reason"] == "stop"
    assert out["vllm"]["reasoning"] == "thought b" and out["vllm"]["finish_reason"] == "length"
    # no usage sent: the reply counted with the tokenizer given (thinking included)
    assert out["vllm"]["text"] == "the answer" and out["vllm"]["tokens"] == 4
    assert out["gateway"]["finish_reason"] == "length" and out["gateway"]["tokens"] == 2
    for k in ("filtered", "null", "no message"):  # counted failed and asked again on rerun
        assert "error" in out[k] and "no choices" in out[k]["error"], out[k]
    assert "content filter" in out["content filter"]["error"]


class _Models(_Handler):
    """GET /v1/models as vLLM answers it (401 for a server whose key is not given), and
    a request under a name it does not serve refused as vLLM does (404) or answered as
    llama.cpp's server does (`any_name`: its one model, whatever the request names)."""
    status, any_name = 200, False

    def do_GET(self):
        if self.status == 0:  # a server whose /models is a web page
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>hello</html>")
            return
        send_json(self, {"object": "list", "data": [{"id": "org/served", "object": "model"}]}
                  if self.status == 200 else {"error": "unauthorized"}, self.status)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["model"] != "org/served" and not self.any_name:
            send_json(self, {"error": {"message": f"The model `{body['model']}` does not exist."}}, 404)
            return
        send_json(self, {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                         "choices": [{"index": 0, "finish_reason": "length", "message": MESSAGE}]})


def test_the_server_is_checked_before_any_prompt_goes_out(monkeypatch):
    with serving(_Models) as port:
        _backend(port, model="org/served").check_server()
        with pytest.raises(ConfigError, match="openai.model=m is not served at .* it serves org/served"):
            _backend(port).check_server()
        monkeypatch.setattr(_Models, "any_name", True)  # not listed, but answered: let through
        _backend(port).check_server()
        monkeypatch.setattr(_Models, "status", 0)  # no model list to read: let through
        _backend(port).check_server()
        monkeypatch.setattr(_Models, "status", 401)
        with pytest.raises(ConfigError, match=r"refused the API key \(HTTP 401\): set \$NONE"):
            _backend(port, model="org/served").check_server()
    with serving(_Handler) as port:  # no model list (HTTP 501 on GET): let through
        _backend(port).check_server()
    with pytest.raises(ConfigError, match="no server answers there"):
        _backend(port).check_server()  # that server is gone


def test_a_server_that_goes_away_stops_the_run_instead_of_failing_every_prompt():
    reqs = [SimpleNamespace(key=k, messages=[{"role": "user", "content": k}])
            for k in ("sglang", "vllm", "gateway")]
    with serving(_Handler) as port:
        assert len(_backend(port).generate(reqs)) == 3
    with pytest.raises(DataError, match="stopped answering: all 3 requests of batch 5 found "
                                        "no server .*rerun the same command"):
        _backend(port).generate(reqs, batch_index=5)
