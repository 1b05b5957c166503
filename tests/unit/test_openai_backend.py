"""The OpenAI-compatible backend against the reply shapes servers really send: a real
HTTP server on loopback answers each prompt with another server's shape."""
import json
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

from dflash.decode.backend import Sampling
from dflash.decode.server import OpenAIBackend
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


def test_reasoning_under_either_name_and_a_reply_without_a_choice_is_a_failed_request():
    with serving(_Handler) as port:
        backend = OpenAIBackend(SimpleNamespace(
            base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key_env="NONE",
            concurrency=2, timeout=10, retries=0), Sampling(max_new_tokens=8),
            tokenizer=_WordCounter())
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
