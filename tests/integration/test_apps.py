import json

import numpy as np
import pytest

from tests.helpers.paths import CONF
from tests.helpers.run import run_module

GROUPS = {g: sorted(p.stem for p in (CONF / g).glob("*.yaml"))
          for g in ("data", "model", "batching", "buckets", "warmup", "topology", "logger")}


_run = run_module

def test_plan_app_report_and_dump(tmp_path):
    rng = np.random.default_rng(0)
    lengths = rng.integers(65, 8192, 3000)
    np.save(tmp_path / "len.npy", lengths)
    out = _run("dflash.plan", f"lengths_file={tmp_path}/len.npy", "batching=bucketed",
               "buckets=seed6", "epochs=3", "seed=5", f"report={tmp_path}/r.json",
               f"dump={tmp_path}/dump", "topology.dp_size=4", f"hydra.run.dir={tmp_path}/run")
    assert "padding_efficiency=" in out.stdout and "per bucket" in out.stdout
    (rep,) = json.loads((tmp_path / "r.json").read_text())
    for key in ("strategy", "num_samples", "useful_tokens", "padded_tokens", "padding_efficiency",
                "num_batches", "pair_repeat_rate", "length_mixing", "plan_seconds", "buckets"):
        assert key in rep
    assert set(rep["buckets"][0]) >= {"lo", "hi", "samples", "batches", "mean_batch_size",
                                      "efficiency"}
    assert rep["useful_tokens"] == int(lengths.sum()) and rep["distributed"]["world_size"] == 4
    for e in range(3):
        z = np.load(tmp_path / "dump" / f"epoch{e}.npz")
        assert z["indices"].dtype == np.int64 and z["offsets"].dtype == np.int64
        assert z["bucket"].dtype == np.int32
        assert np.array_equal(np.sort(z["indices"]), np.arange(3000))
        assert len(z["bucket"]) == len(z["offsets"]) - 1
    assert not (tmp_path / "dump" / "epoch3.npz").exists()
    z0 = np.load(tmp_path / "dump" / "epoch0.npz")
    assert rep["num_batches"] == len(z0["bucket"])


def test_plan_multirun_fills_one_report(tmp_path):
    np.save(tmp_path / "len.npy", np.random.default_rng(1).integers(1, 4000, 2000))
    _run("dflash.plan", "--multirun", "batching=sorted,random,megabatch",
         f"lengths_file={tmp_path}/len.npy", f"report={tmp_path}/r.json",
         f"plot={tmp_path}/tradeoff.png", f"hydra.sweep.dir={tmp_path}/multi")
    reps = json.loads((tmp_path / "r.json").read_text())
    assert sorted(r["strategy"] for r in reps) == ["megabatch", "random", "sorted"]
    assert (tmp_path / "tradeoff.png").read_bytes()[:4] == b"\x89PNG"
    # rerunning one strategy replaces its entry instead of appending a duplicate
    _run("dflash.plan", "batching=random", f"lengths_file={tmp_path}/len.npy",
         f"report={tmp_path}/r.json", f"hydra.run.dir={tmp_path}/again")
    assert len(json.loads((tmp_path / "r.json").read_text())) == 3


def test_plan_app_bad_input_fails_clearly(tmp_path):
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    proc = _run("dflash.plan", f"lengths_file={tmp_path}/bad.npy",
                f"hydra.run.dir={tmp_path}/run", check=False)
    assert proc.returncode != 0 and "bad.npy is not a readable .npy array" in proc.stderr
    np.save(tmp_path / "long.npy", np.array([100, 60000]))
    proc = _run("dflash.plan", f"lengths_file={tmp_path}/long.npy", "data.max_seq_len=100000",
                f"hydra.run.dir={tmp_path}/run", check=False)
    assert proc.returncode != 0 and "sample 1 has length 60000" in proc.stderr


@pytest.mark.parametrize("case", ["negative", "missing", "unsorted", "report a dir",
                                  "preset a dir", "preset under a file", "plan cost", "buckets cost"])
def test_user_errors_end_with_one_message_not_a_traceback(tmp_path, case):
    np.save(tmp_path / "neg.npy", np.array([5, -3, 7]))
    np.save(tmp_path / "ok.npy", np.array([10, 20, 30, 400]))
    ok = f"lengths_file={tmp_path}/ok.npy"
    app, args = {"negative": ("plan", [f"lengths_file={tmp_path}/neg.npy"]),
                 "missing": ("plan", [f"lengths_file={tmp_path}/nope.npy"]),
                 "unsorted": ("plan", ["buckets.kind=fixed", "buckets.boundaries=[1,500,200,9000]"]),
                 # a file written at the end, named where it cannot be: refused at start
                 "report a dir": ("plan", [ok, f"report={tmp_path}"]),
                 "preset a dir": ("buckets", [ok, "num_buckets=2", f"out={tmp_path}"]),
                 "preset under a file": ("buckets", [ok, "num_buckets=2",
                                                     f"out={tmp_path}/ok.npy/p.yaml"]),
                 # a cost file that cannot be used: refused before the data is read
                 # (the data, missing here, would have been refused first)
                 "plan cost": ("plan", [f"lengths_file={tmp_path}/nope.npy",
                                        f"cost={tmp_path}/ok.npy"]),
                 "buckets cost": ("buckets", [f"lengths_file={tmp_path}/nope.npy",
                                              f"cost={tmp_path}/c.json"])}[case]
    proc = _run(f"dflash.{app}", *args, f"hydra.run.dir={tmp_path}/run", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("dflash: error:") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert ("cost file" in proc.stderr) == case.endswith("cost")


def test_dump_keeps_original_ids_when_overlong_samples_are_dropped(tmp_path):
    lengths = np.array([10, 9000, 20, 30, 9500, 40])
    np.save(tmp_path / "len.npy", lengths)
    _run("dflash.plan", f"lengths_file={tmp_path}/len.npy", "data.max_seq_len=8192",
         "data.overlong=drop", "epochs=1", f"dump={tmp_path}/d", f"report={tmp_path}/r.json",
         f"hydra.run.dir={tmp_path}/run")
    z = np.load(tmp_path / "d" / "epoch0.npz")
    assert sorted(z["indices"].tolist()) == [0, 2, 3, 5]
    (rep,) = json.loads((tmp_path / "r.json").read_text())
    assert rep["data"]["overlong_samples"] == 2 and rep["num_samples"] == 4


def test_train_rejects_data_outside_the_target_vocabulary(tmp_path):
    from omegaconf import OmegaConf
    from dflash.config import TargetConfig
    from dflash.model.target import build_tiny_qwen3
    build_tiny_qwen3(OmegaConf.structured(TargetConfig(vocab_size=256))).save_pretrained(tmp_path / "m")
    proc = _run("dflash.train", "data=synthetic", "data.num_samples=50",
                f"data.cache_dir={tmp_path}/cache", f"model.target.path={tmp_path}/m", f"hydra.run.dir={tmp_path}/run", check=False)
    assert proc.returncode != 0
    assert "outside the model vocabulary of 256" in proc.stderr


def test_every_app_refuses_a_run_dir_under_a_file_in_one_line(tmp_path):
    (tmp_path / "f").write_text("")
    for app in ("plan", "buckets", "train", "eval", "regenerate", "profile", "end_to_end"):
        proc = _run(f"dflash.{app}", f"hydra.run.dir={tmp_path / 'f' / 'run'}", check=False)
        assert proc.returncode == 2, (app, proc.stderr[-500:])
        assert proc.stderr.strip() == (f"dflash: error: hydra.run.dir={tmp_path / 'f' / 'run'}: "
                                       f"{tmp_path / 'f'} is a file, not a directory"), app
