import json

import numpy as np



def _jsonl(path, convs):
    path.write_text("\n".join(json.dumps({"messages": c}) for c in convs) + "\n")
    return path


def test_prepare_cli_then_plan_and_buckets_on_the_data_set(tmp_path, chat_tokenizer):
    from tests.helpers.run import run_module
    rng = np.random.default_rng(0)
    convs = []
    for _ in range(60):
        q = " ".join(f"w{i}" for i in rng.integers(0, 200, rng.integers(1, 30)))
        a = " ".join(f"w{i}" for i in rng.integers(0, 200, rng.integers(1, 60)))
        convs.append([{"role": "user", "content": q}, {"role": "assistant", "content": a}])
    f = _jsonl(tmp_path / "c.jsonl", convs)
    run = lambda *a: run_module(*a, check=False)  # noqa: E731
    p = run("dflash.data.prepare", "--jsonl", str(f), "--tokenizer", str(chat_tokenizer),
            "--out", str(tmp_path / "ds"), "--max-seq-len", "64", "--overlong", "truncate")
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "ds" / "prepare_report.json").read_text())
    assert summary["samples"] == 60 and summary["overlong_samples"] > 0
    p = run("dflash.plan", "data=tokenized", f"data.path={tmp_path}/ds", "data.max_seq_len=64",
            "batching.token_budget=512", "buckets=quantile", "buckets.num_buckets=3",
            f"report={tmp_path}/r.json", f"hydra.run.dir={tmp_path}/run")
    assert p.returncode == 0, p.stderr
    (rep,) = json.loads((tmp_path / "r.json").read_text())
    assert rep["num_samples"] == 60 and rep["useful_tokens"] == summary["tokens"]
    p = run("dflash.buckets", "data=tokenized", f"data.path={tmp_path}/ds", "data.max_seq_len=64",
            "batching.token_budget=512", "num_buckets=2", f"hydra.run.dir={tmp_path}/run2")
    assert p.returncode == 0, p.stderr
    assert "simulated_efficiency=" in p.stdout
    p = run("dflash.plan", "data=tokenized", f"data.path={tmp_path}/ds", "data.max_seq_len=32",
            f"hydra.run.dir={tmp_path}/run3")
    assert p.returncode != 0 and "more than data.max_seq_len=32" in p.stderr
