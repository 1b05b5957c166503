"""The target -> drafter pipeline and the topology checks (two gloo ranks through torchrun:
`test_resume.py`, with their preemption)."""
import json
import threading

import pytest
import torch

from dflash.config import compose
from tests.helpers.run import build_trainer, QUIET
from dflash.errors import TopologyError
from dflash.loggers import Logger


def _runner(cache, out, overrides):
    return build_trainer(cache, out, *QUIET, *overrides)


def _pipeline_threads():
    return [t for t in threading.enumerate() if t.name.startswith("dflash-")]


def _weights(r):
    return {k: v.detach().clone() for k, v in r.drafter.state_dict().items()}


def test_pipelined_training_equals_sequential(tmp_path, world_cache):
    """Same batches, same order, same final weights, whatever the queue depth; a run
    stopped mid-epoch (max_steps) leaves no pipeline thread behind. One intra-op thread:
    a pipelined CPU run splits the cores between its stages, and bit-equal weights need
    the same reduction order in both runs."""
    runs = {}
    threads = torch.get_num_threads()
    for depth in (0, 3):
        r = _runner(world_cache, tmp_path / str(depth), [f"pipeline.depth={depth}",
                                                          "epochs=2", "optim.max_steps=36"])
        torch.set_num_threads(1)
        try:
            summary = r.train(Logger())
        finally:
            torch.set_num_threads(threads)
        runs[depth] = (r.batches_seen, _weights(r), summary)
        assert _pipeline_threads() == []
    seen0, w0, s0 = runs[0]
    assert len(seen0) == 36 and seen0[-1][0] == 1  # into the second epoch, stopped inside it
    for depth in (3,):
        seen, w, s = runs[depth]
        assert seen == seen0
        assert all(torch.equal(w[k], w0[k]) for k in w0)
        assert s["final_loss"] == s0["final_loss"]
    stages = runs[3][2]["stage_ms"]
    assert {"time_target_ms", "time_drafter_ms", "time_drafter_wait_ms", "time_target_wait_ms",
            "time_data_wait_ms"} <= set(stages)
    assert stages["time_target_ms"] > 0 and stages["time_drafter_ms"] > 0


def test_a_failing_stage_stops_the_run_with_its_error(tmp_path, world_cache):
    from dflash.errors import DataError
    r = _runner(world_cache, tmp_path, ["pipeline.depth=2", "epochs=1"])
    real = r.dataset.collate
    calls = []

    def broken(ids, seq_len):
        calls.append(1)
        if len(calls) == 3:
            raise DataError("sample 7: corrupt on disk (test)")
        return real(ids, seq_len)

    r.dataset.collate = broken
    with pytest.raises(DataError, match="sample 7: corrupt"):
        r.train(Logger())
    assert _pipeline_threads() == []


def test_metrics_log_stage_timings(tmp_path, world_cache):
    from dflash.loggers import JsonlLogger
    r = _runner(world_cache, tmp_path, ["pipeline.depth=2", "epochs=1", "optim.max_steps=6",
                                        "logger.log_every=3"])
    logger = JsonlLogger(tmp_path / "metrics.jsonl")
    r.train(logger)
    logger.finish()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(r_["bottleneck"] in ("target", "drafter") for r_ in rows)
    assert all(r_["time_target_ms"] > 0 and "time_drafter_wait_ms" in r_ for r_ in rows)


def test_cpu_stages_share_the_cores_and_default_to_sequential(tmp_path, world_cache):
    """Target and drafter on the CPU: null depth runs the sequential loop; a set depth
    gives each stage thread its share of the cores (never both the whole machine) and
    hands the caller its thread count back."""
    auto = _runner(world_cache, tmp_path / "auto", ["epochs=1", "optim.max_steps=2"])
    assert auto.train(Logger())["pipeline_depth"] == 0
    r = _runner(world_cache, tmp_path / "d2", ["pipeline.depth=2", "epochs=1", "optim.max_steps=4",
                                             "warmup=none"])
    seen = {}

    def record(fn, stage):
        def wrapped(*a, **k):
            seen.setdefault(stage, set()).add(torch.get_num_threads())
            return fn(*a, **k)
        return wrapped
    r.train_step.context = record(r.train_step.context, "target")
    r.train_step.drafter_step = record(r.train_step.drafter_step, "drafter")
    before = torch.get_num_threads()
    assert r.train(Logger())["pipeline_depth"] == 2
    assert len(seen["target"]) == len(seen["drafter"]) == 1, seen
    (target,), (drafter,) = seen["target"], seen["drafter"]
    assert target + drafter <= max(2, before) and target >= 1 and drafter >= 1
    assert torch.get_num_threads() == before


def test_wrong_process_count_is_refused(world_cache):
    from dflash.topology import build_topology
    cfg = compose("train", ["topology=8gpu"])
    with pytest.raises(TopologyError, match="dp_size=4 data-parallel processes but 1 were started"):
        build_topology(cfg.topology)
