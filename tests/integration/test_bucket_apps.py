import numpy as np
import pytest
import yaml

from dflash.batching.boundaries import computed_boundaries, preset_boundaries
from tests.helpers.run import run_module

SEED6 = preset_boundaries("seed6")


def _run(*args, check=True):
    return run_module("dflash.buckets", *args, check=check)


def test_app_writes_a_preset_the_plan_can_select(tmp_path):
    rng = np.random.default_rng(5)
    np.save(tmp_path / "len.npy", rng.integers(65, 8000, 20000))
    (tmp_path / "conf" / "buckets").mkdir(parents=True)
    preset = tmp_path / "conf" / "buckets" / "fitted.yaml"
    out = _run(f"lengths_file={tmp_path}/len.npy", "num_buckets=5", f"out={preset}",
               f"plot={tmp_path}/fit.png", f"hydra.run.dir={tmp_path}/run")
    assert "simulated_efficiency=" in out.stdout and "per bucket" in out.stdout
    doc = yaml.safe_load(preset.read_text())
    assert doc["name"] == "fitted" and len(doc["boundaries"]) == 6
    assert 0 < doc["meta"]["simulated_efficiency"] <= 1
    assert (tmp_path / "fit.png").read_bytes()[:4] == b"\x89PNG"
    run_module("dflash.plan", f"lengths_file={tmp_path}/len.npy",
               f"hydra.searchpath=[file://{tmp_path}/conf]", "buckets=fitted",
               f"report={tmp_path}/r.json", f"hydra.run.dir={tmp_path}/run2")
    import json
    (rep,) = json.loads((tmp_path / "r.json").read_text())
    assert rep["boundaries"] == doc["boundaries"]
    assert rep["padding_efficiency"] == pytest.approx(doc["meta"]["simulated_efficiency"], abs=0.01)


def test_app_rejects_bad_files_and_k(tmp_path):
    np.save(tmp_path / "two_d.npy", np.ones((3, 3), dtype=np.int64))
    proc = _run(f"lengths_file={tmp_path}/two_d.npy", f"hydra.run.dir={tmp_path}/r", check=False)
    assert proc.returncode and "expected a 1-D array" in proc.stderr
    np.save(tmp_path / "f.npy", np.array([1.5, 2.0]))
    proc = _run(f"lengths_file={tmp_path}/f.npy", f"hydra.run.dir={tmp_path}/r", check=False)
    assert proc.returncode and "non-integer length" in proc.stderr
    np.save(tmp_path / "ok.npy", np.array([10, 20, 30]))
    proc = _run(f"lengths_file={tmp_path}/ok.npy", "num_buckets=many",
                f"hydra.run.dir={tmp_path}/r", check=False)
    assert proc.returncode and "integer or 'auto'" in proc.stderr


def test_top_bucket_covers_every_length_the_data_config_allows(tmp_path):
    import json
    lengths = np.random.default_rng(9).integers(100, 8000, 5000)
    lengths[:3] = [8192, 9000, 20000]  # truncated to exactly max_seq_len
    np.save(tmp_path / "len.npy", lengths)
    for preset in ("seed6", "quantile"):
        run_module("dflash.plan", f"lengths_file={tmp_path}/len.npy", "data.overlong=truncate",
                   f"buckets={preset}", f"report={tmp_path}/{preset}.json",
                   f"hydra.run.dir={tmp_path}/{preset}")
        (rep,) = json.loads((tmp_path / f"{preset}.json").read_text())
        assert rep["boundaries"][-1] == 8193 and rep["num_samples"] == 5000
    assert rep["boundaries"][:-1] == computed_boundaries("quantile", np.minimum(lengths, 8192),
                                                         6).tolist()[:-1]
    out = run_module("dflash.plan", f"lengths_file={tmp_path}/len.npy", "data.overlong=truncate",
                     "buckets=seed6", "buckets.cover_max_len=false",
                     f"hydra.run.dir={tmp_path}/off", check=False)
    assert out.returncode == 2 and "length 8192 outside [0, 8192)" in out.stderr
