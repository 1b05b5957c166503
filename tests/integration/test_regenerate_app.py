"""`python -m dflash.regenerate`: local target and an OpenAI-compatible server on
loopback; output that prepare reads; resume after kill -9; bad input named."""
import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from tests.helpers.http import send_json
from tests.helpers.paths import REPO
from tests.helpers.run import run_module, torchrun_ok

VOCAB = 208  # the chat_tokenizer fixture's vocabulary


def _chats(n, turns=1, start=0):
    out = []
    for i in range(start, start + n):
        msgs = []
        for t in range(turns):
            msgs += [{"role": "user", "content": " ".join(f"w{(i * 7 + t + k) % 200}" for k in range(3 + i % 5))},
                     {"role": "assistant", "content": f"w{i % 200} w{(i + 1) % 200}"}]
        out.append({"id": i, "messages": msgs})
    return out


def _jsonl(path, rows, extra=b""):
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows) + extra)
    return path


def _args(tok, inp, out, *extra):
    # model=tiny: an in-memory target of the tokenizer's size (the app's default is a
    # local model, model=hf)
    return [f"inputs=[{inp}]", f"out={out}", f"tokenizer={tok}", "model=tiny",
            f"model.target.vocab_size={VOCAB}",
            "max_new_tokens=12", "max_seq_len=64", "progress=false",
            f"hydra.run.dir={out.parent / 'hydra'}", *extra]


def test_local_greedy_regeneration_feeds_prepare(tmp_path, chat_tokenizer):
    src = _chats(10)
    for c in src[1::2]:  # prompts only: the reply is the target's to write
        c["messages"] = c["messages"][:-1]
    inp = _jsonl(tmp_path / "in.jsonl", src, extra=b"{broken\n" + json.dumps(
        {"messages": [{"role": "user", "content": " ".join(["w1"] * 80)},
                      {"role": "assistant", "content": "w2"}]}).encode() + b"\n")
    out = tmp_path / "regen.jsonl"
    proc = run_module("dflash.regenerate", *_args(chat_tokenizer, inp, out,
                                                  "batching.token_budget=128",
                                                  "batching.max_batch_size=4"))
    assert "10 of 12 conversations written" in proc.stdout, proc.stdout
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(10))  # input order, ids kept
    for r in rows:
        assert r["messages"][-1]["role"] == "assistant"
        assert r["finish_reason"] in ("stop", "length") and 1 <= r["generated_tokens"] <= 12
    report = json.loads((tmp_path / "regen.jsonl.report.json").read_text())
    assert report["lines_skipped"] == 2
    reasons = {s["where"]: s["reason"] for s in report["skipped"]}
    assert "invalid JSON" in reasons[f"{inp}:11"] and "overlong prompt" in reasons[f"{inp}:12"]
    # the target's own greedy continuation, token for token (HF generate, no cache tricks)
    from transformers import AutoTokenizer
    from omegaconf import OmegaConf
    from dflash.config import TargetConfig
    from dflash.model.target import Target
    import torch
    tok = AutoTokenizer.from_pretrained(str(chat_tokenizer))
    target = Target.from_config(OmegaConf.structured(TargetConfig(vocab_size=VOCAB))).eval()
    for i in (0, 7):
        prompt = src[i]["messages"][:-1] if i % 2 == 0 else src[i]["messages"]
        text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        stop = [tok.convert_tokens_to_ids("<|im_end|>")]
        want = target.lm.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=stop,
                                  pad_token_id=0)[0, ids.shape[1]:].tolist()
        want = want[:want.index(stop[0])] if stop[0] in want else want
        assert rows[i]["messages"][-1]["content"] == tok.decode(want).strip()
    # prepare reads it unchanged, and a drafter trains on it (the same target)
    from dflash.data.prepare import prepare
    from dflash.config import compose
    from dflash.trainer import Trainer
    ds, _ = prepare(out, chat_tokenizer, tmp_path / "data")
    # the prepared replies are the target's own: teacher-forced, it picks every one
    for k in range(len(ds)):
        ids, mask = ds.sample(k)
        sup = np.flatnonzero(mask)
        logits = target.lm(torch.tensor(ids)[None]).logits[0]
        assert (logits[sup - 1].argmax(-1).numpy() == ids[sup]).all(), k
    cfg = compose("train", ["data=tokenized", f"data.path={tmp_path / 'data'}", "data.max_seq_len=64",
                            f"model.target.vocab_size={VOCAB}", "model.drafter.block_size=4",
                            "eval.num_prompts=2", "eval.max_new_tokens=8", "optim.max_steps=3",
                            "warmup=none", "logger.progress=false"])
    summary = Trainer(cfg, tmp_path / "train").build().run()
    assert summary["steps"] == 3 and summary["samples_seen"] > 0
    assert summary["data"]["num_samples"] == 10 and summary["data"]["held_out"] == 2
    assert summary["samples_seen"] <= 8  # the 2 held-out prompts are not trained on
    assert (tmp_path / "train" / "drafter" / "model.safetensors").exists()


def test_a_killed_run_resumes_without_generating_twice(tmp_path, chat_tokenizer):
    inp = _jsonl(tmp_path / "in.jsonl", _chats(12))
    args = _args(chat_tokenizer, inp, tmp_path / "a.jsonl", "batching.max_batch_size=2",
                 "batching.token_budget=64")
    proc = subprocess.Popen([sys.executable, "-m", "dflash.regenerate", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = tmp_path / "a.jsonl.parts" / "round-0"
    t0 = time.time()
    while len(list(parts.glob("part-*.jsonl"))) < 2:
        assert proc.poll() is None and time.time() - t0 < 200
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = len(list(parts.glob("part-*.jsonl")))
    assert not (tmp_path / "a.jsonl").exists()
    run_module("dflash.regenerate", *args)
    report = json.loads((tmp_path / "a.jsonl.report.json").read_text())
    assert report["batches_resumed"] == before and report["batches_this_run"] + before == 6
    ref = tmp_path / "ref.jsonl"
    run_module("dflash.regenerate", *_args(chat_tokenizer, inp, ref, "batching.max_batch_size=2",
                                           "batching.token_budget=64"))
    assert (tmp_path / "a.jsonl").read_text() == ref.read_text()
    # a rerun with other settings does not mix into these parts
    bad = run_module("dflash.regenerate", *args[:-1], "max_new_tokens=8", args[-1], check=False)
    assert bad.returncode == 2 and "max_new_tokens differs" in bad.stderr
    # nor one under another target dtype (bf16 parts never finish a float32 run)
    dtype = run_module("dflash.regenerate", *args[:-1], "model.target.dtype=bfloat16", args[-1],
                       check=False)
    assert dtype.returncode == 2 and "target differs" in dtype.stderr


class _Server(BaseHTTPRequestHandler):
    seen, failed, inflight, peak, lock = [], set(), 0, 0, threading.Lock()

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            cls.inflight += 1
            cls.peak = max(cls.peak, cls.inflight)
        time.sleep(0.05)
        key = json.dumps(body["messages"])
        with cls.lock:
            cls.inflight -= 1
            first = key not in cls.failed
            cls.failed.add(key)
        if first:  # every request fails once: the client must retry it
            self.send_response(500)
            self.end_headers()
            return
        cls.seen.append(body)
        last = body["messages"][-1]["content"]
        reply = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "finish_reason": "stop", "message": {
                     "role": "assistant", "content": f"re: {last}",
                     "reasoning_content": "thought"}}],
                 "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
        send_json(self, reply)


def test_openai_backend_each_turn_with_retries_and_bounded_concurrency(tmp_path, chat_tokenizer):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        inp = _jsonl(tmp_path / "in.jsonl", _chats(6, turns=2))
        out = tmp_path / "o.jsonl"
        run_module("dflash.regenerate", *_args(chat_tokenizer, inp, out, "backend=openai",
                   f"openai.base_url=http://127.0.0.1:{srv.server_port}/v1", "openai.concurrency=3",
                   "openai.retries=2", "turns=each", "+chat_template_kwargs.enable_thinking=false"))
    finally:
        srv.shutdown()
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 6 and all(r["finish_reasons"] == ["stop", "stop"] for r in rows)
    m = rows[0]["messages"]
    assert m[1]["content"] == f"re: {m[0]['content']}" and m[1]["reasoning_content"] == "thought"
    assert m[3]["content"] == f"re: {m[2]['content']}"
    # turn 2 was asked with the regenerated turn 1 in its prompt
    second = [b for b in _Server.seen if len(b["messages"]) == 3]
    assert len(second) == 6 and all(b["messages"][1]["content"].startswith("re: ") for b in second)
    assert all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in _Server.seen)
    assert 1 < _Server.peak <= 3


def test_a_server_that_does_not_answer_is_refused_before_any_prompt(tmp_path, chat_tokenizer):
    import socket
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inp = _jsonl(tmp_path / "in.jsonl", _chats(4))
    out = tmp_path / "o.jsonl"
    proc = run_module("dflash.regenerate", *_args(chat_tokenizer, inp, out, "backend=openai",
                      f"openai.base_url=http://127.0.0.1:{port}/v1", "openai.retries=0"),
                      check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("no server answers there "
                                                         "(Connection error.); start it or fix the URL")
    assert not out.exists() and not (tmp_path / "o.jsonl.parts").exists()


def test_every_local_path_writes_the_same_greedy_replies(tmp_path, chat_tokenizer):
    """A dflash drafter accelerates greedy decoding without changing it; so does the
    compiled static-cache path; two gloo ranks under torchrun, or two submitit tasks
    through Hydra's launcher, split the batches and merge one output."""
    from omegaconf import OmegaConf
    from dflash.config import DrafterConfig, TargetConfig
    from dflash.model.checkpoint import save_drafter
    from dflash.model.drafter import DFlashDrafter, DrafterSpec
    from dflash.model.target import Target
    target = Target.from_config(OmegaConf.structured(TargetConfig(vocab_size=VOCAB)))
    save_drafter(DFlashDrafter(DrafterSpec.from_target(
        target, OmegaConf.structured(DrafterConfig(block_size=4)))), tmp_path / "ckpt")
    inp = _jsonl(tmp_path / "in.jsonl", _chats(8))
    outs = {}
    for name, extra in [
            ("plain", []), ("drafter", [f"drafter={tmp_path / 'ckpt'}"]),
            # eager: dynamo's graphs over the static cache, without inductor's code generation
            ("compiled", ["model.compile=static", "model.compile_backend=eager",
                          "batching.pad_to_multiple=16"]),
            ("submitit", ["hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
                          "hydra.launcher.timeout_min=5", f"hydra.sweep.dir={tmp_path / 'sweep'}"]),
            ("ranks", None)]:
        out = tmp_path / name / "o.jsonl"
        out.parent.mkdir()
        args = _args(chat_tokenizer, inp, out, "batching.max_batch_size=2", *(extra or []))
        if extra is None:  # two processes under torchrun
            proc = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                                   "--nproc_per_node=2", "--master_port=29547",
                                   "-m", "dflash.regenerate", *args], cwd=REPO, text=True,
                                  capture_output=True, timeout=300)
            torchrun_ok(proc)
        else:  # a launcher plugin is a multirun's
            run_module("dflash.regenerate", *(["-m"] if name == "submitit" else []), *args)
        outs[name] = out.read_text()
    for name in ("drafter", "compiled", "submitit", "ranks"):
        assert outs[name] == outs["plain"], name
    for name in ("ranks", "submitit"):  # 8 prompts, 2 a batch: both ranks wrote theirs
        parts = sorted((tmp_path / name / "o.jsonl.parts" / "round-0").glob("part-*"))
        assert len(parts) == 4
        assert json.loads((tmp_path / name / "o.jsonl.parts" / "manifest.json").read_text())[
            "world_size"] == 2


def test_missing_tokenizer_and_a_sampled_drafter_run_are_refused(tmp_path, chat_tokenizer):
    inp = _jsonl(tmp_path / "in.jsonl", _chats(2))
    args = [a for a in _args(chat_tokenizer, inp, tmp_path / "o.jsonl") if not a.startswith("tokenizer=")]
    proc = run_module("dflash.regenerate", *args, check=False)
    assert proc.returncode == 2 and "regenerate needs a tokenizer: set tokenizer=DIR" in proc.stderr
    proc = run_module("dflash.regenerate", *_args(chat_tokenizer, inp, tmp_path / "o.jsonl",
                                                  f"drafter={tmp_path}", "temperature=0.7"), check=False)
    assert proc.returncode == 2 and "greedy decoding only (temperature=0)" in proc.stderr
    proc = run_module("dflash.regenerate", *_args(chat_tokenizer, inp, tmp_path / "o.jsonl",
                                                  f"drafter={tmp_path}", "model.compile=static"),
                      check=False)
    assert proc.returncode == 2 and "model.compile compiles plain decoding" in proc.stderr
    assert "Traceback" not in proc.stderr


class _FlakyServer(BaseHTTPRequestHandler):
    """Conversation 1 fails on every request while `broken`; conversation 2's first
    request outlasts the client's timeout; the rest answer at once."""
    broken, slow_done, asked, lock = True, False, [], threading.Lock()

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls, last = type(self), body["messages"][-1]["content"]
        with cls.lock:
            cls.asked.append(last)
            slow = last.startswith("w14 ") and not cls.slow_done
            cls.slow_done = cls.slow_done or slow
        if slow:
            time.sleep(1.6)  # past openai.timeout=1: the client gives up and retries
        if cls.broken and last.startswith("w7 "):
            self.send_response(503)
            self.end_headers()
            return
        reply = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": f"re: {last}"}}]}
        try:
            send_json(self, reply)
        except (BrokenPipeError, ConnectionResetError):  # the timed-out request's client left
            pass


def test_failed_requests_are_counted_then_asked_again_on_rerun(tmp_path, chat_tokenizer):
    """A request that times out is retried; one that fails through its retries is named
    in the report and its conversation left out; rerunning the same command asks the
    server for that one alone."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    inp = _jsonl(tmp_path / "in.jsonl", _chats(6))
    out = tmp_path / "o.jsonl"
    args = _args(chat_tokenizer, inp, out, "backend=openai", "openai.retries=1",
                 "openai.timeout=1", f"openai.base_url=http://127.0.0.1:{srv.server_port}/v1")
    try:
        first = run_module("dflash.regenerate", *args)
        report = json.loads((tmp_path / "o.jsonl.report.json").read_text())
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        assert [r["id"] for r in rows] == [0, 2, 3, 4, 5]  # the timed-out one retried and kept
        assert report["lines_skipped"] == 1 and report["conversations_written"] == 5
        (skip,) = report["skipped"]
        assert skip["where"] == f"{inp}:2" and "request failed" in skip["reason"]
        assert "1 skipped" in first.stdout
        assert sum(a.startswith("w7 ") for a in _FlakyServer.asked) == 2  # 1 + 1 retry
        assert sum(a.startswith("w14 ") for a in _FlakyServer.asked) == 2  # timed out, retried
        _FlakyServer.broken, _FlakyServer.asked = False, []
        second = run_module("dflash.regenerate", *args)
    finally:
        srv.shutdown()
    assert [a.split()[0] for a in _FlakyServer.asked] == ["w7"]  # only the failed one again
    assert "1 failed requests asked again" in second.stdout
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(6))
    assert rows[1]["messages"][-1]["content"] == f"re: {_chats(6)[1]['messages'][0]['content']}"
