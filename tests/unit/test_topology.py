"""Ranks from the launcher's environment: a submitit task learns its rank, world size
and rendezvous from the job, keeps every GPU visible (dflash maps pairs itself), and CPU
processes sharing a node split its cores."""
import os

import pytest
import torch

from dflash.config import compose
from dflash.topology import build_topology, export_submitit_env

LOCAL_TASK = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "77",
              "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
              "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_GLOBALID": "1",
              "SUBMITIT_LOCAL_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
EXPORTED = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "OMP_NUM_THREADS")


@pytest.fixture
def task_env(monkeypatch):
    for k in EXPORTED:
        monkeypatch.delenv(k, raising=False)
    for k, v in LOCAL_TASK.items():
        monkeypatch.setenv(k, v)
    yield
    for k in EXPORTED:  # export() wrote them behind monkeypatch's back
        os.environ.pop(k, None)


def test_a_submitit_task_takes_its_rank_and_keeps_every_gpu_visible(task_env):
    pytest.importorskip("submitit")
    export_submitit_env()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"],
            os.environ["LOCAL_WORLD_SIZE"]) == ("1", "2", "1", "2")
    assert os.environ["MASTER_ADDR"] and int(os.environ["MASTER_PORT"]) > 0
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_cpu_processes_sharing_a_node_split_its_cores(monkeypatch):
    for k in EXPORTED:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: None)
    cfg = compose("train", ["topology.dp_size=2"])
    threads = torch.get_num_threads()
    try:
        build_topology(cfg.topology)
        assert torch.get_num_threads() == 4
        torch.set_num_threads(threads)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a launcher's choice (torchrun's) stands
        build_topology(cfg.topology)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(threads)


def test_a_process_group_dflash_starts_is_destroyed_before_the_interpreter_ends(monkeypatch):
    """Left to interpreter finalization, gloo's worker threads can abort a rank whose run
    succeeded (SIGABRT): the group is destroyed at exit, while Python is still whole, and
    its workers get a moment to let go of their tensors."""
    import atexit
    for k in EXPORTED:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    calls, at_exit = [], []
    live = {"group": False}
    monkeypatch.setattr(torch.distributed, "init_process_group",
                        lambda *a, **k: live.update(group=True))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: live["group"])
    monkeypatch.setattr(torch.distributed, "destroy_process_group",
                        lambda *a: (calls.append("destroy"), live.update(group=False)))
    monkeypatch.setattr(atexit, "register", at_exit.append)
    import dflash.topology as topology
    monkeypatch.setattr(topology.time, "sleep", lambda s: calls.append(f"wait {s}s"))
    build_topology(compose("train", ["topology.dp_size=2"]).topology)
    assert live["group"] and len(at_exit) == 1 and not calls
    at_exit[0]()
    at_exit[0]()  # a group already destroyed (by the app itself) is left alone
    # then its worker threads get a moment to free the last collectives' tensors
    assert calls == ["destroy", f"wait {topology.DRAIN_SECONDS}s"] and not live["group"]


def test_every_rank_a_test_starts_ends_as_dflash_ranks_do():
    """Ranks a test starts itself (mp.spawn) end through `shutdown_process_group`:
    `destroy_process_group` alone can leave a gloo worker freeing a tensor after the
    interpreter began to finalize, and the rank aborts after a run that passed."""
    import re
    from tests.helpers.paths import REPO
    starts = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        text = path.read_text()
        if re.search(r"^\s+dist\.init_process_group\(", text, re.M):
            starts.append(path.name)
            assert re.search(r"^\s+shutdown_process_group\(\)", text, re.M), path
            assert not re.search(r"^\s+dist\.destroy_process_group\(", text, re.M), path
    assert {"test_loss_norm_ddp.py", "test_distributed_plans.py"} <= set(starts)


def test_a_tp_size_the_world_cannot_hold_is_refused_naming_the_key():
    from omegaconf import OmegaConf
    from dflash.errors import TopologyError
    from dflash.topology import check_target_tp
    base = compose("train", ["topology=pairs"]).topology
    for tp, world, words in ((2, 1, "this is one process"), (2, 3, "does not divide the 3"),
                             (0, 2, "must be 1 or more")):
        cfg = OmegaConf.merge(base, {"target_tp": tp})
        with pytest.raises(TopologyError, match=f"topology.target_tp={tp}.*{words}"):
            check_target_tp(cfg, world)
    assert check_target_tp(OmegaConf.merge(base, {"target_tp": 2}), 2) == 2
    assert check_target_tp(OmegaConf.merge(base, {"target_tp": 2}), 4) == 2  # 2 TP groups
    pinned = OmegaConf.merge(base, {"target_tp": 2, "target_devices": [0, 2],
                                    "drafter_devices": [1, 3]})
    with pytest.raises(TopologyError, match="target_devices"):
        check_target_tp(pinned, 4)


def _saved(tmp_path, config):
    config.save_pretrained(tmp_path)
    return tmp_path


def test_a_target_tp_cannot_split_is_refused_naming_the_key(tmp_path, monkeypatch):
    from transformers import GPT2Config, Qwen3Config
    from dflash.errors import ConfigError
    from dflash.model import tp_target
    qwen = _saved(tmp_path / "q", Qwen3Config(num_attention_heads=4, num_key_value_heads=2,
                                                hidden_size=64, head_dim=16))
    tp_target.check_tp(qwen, 2)  # 4 heads, 2 KV heads: splits two ways
    with pytest.raises(ConfigError, match="target_tp=4 does not divide.*num_key_value_heads=2"):
        tp_target.check_tp(qwen, 4)
    gpt2 = _saved(tmp_path / "g", GPT2Config())
    with pytest.raises(ConfigError, match="GPT2Config.*no tensor-parallel plan"):
        tp_target.check_tp(gpt2, 2)
    real = tp_target.importlib.util.find_spec
    monkeypatch.setattr(tp_target.importlib.util, "find_spec",
                        lambda name: None if name == "accelerate" else real(name))
    with pytest.raises(ConfigError, match=r"needs the accelerate package: pip install"):
        tp_target.check_tp(qwen, 2)


def test_training_on_cpu_beside_a_gpu_says_so_first(monkeypatch, capsys):
    """The CPU demo's default topology on a GPU machine: one line naming what to add."""
    import torch
    from omegaconf import OmegaConf
    from dflash.train import cpu_notice
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    cpu_notice(OmegaConf.create({"name": "cpu", "device": "cpu"}))
    err = capsys.readouterr().err
    assert "training on CPU (topology=cpu) although 8 GPU(s) are visible" in err
    assert "topology=single_gpu" in err
    cpu_notice(OmegaConf.create({"name": "single_gpu", "device": "cuda"}))
    assert capsys.readouterr().err == ""


def test_a_sharded_load_refuses_an_untested_transformers_release():
    from dflash.errors import ConfigError
    from dflash.model.tp_target import check_transformers_version
    check_transformers_version("5.25.0")
    check_transformers_version("5.0.1")
    with pytest.raises(ConfigError, match="needs transformers 5.0 to 5.25 .*this is 5.30.0"):
        check_transformers_version("5.30.0")
