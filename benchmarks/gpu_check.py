"""Every GPU-only path of dflash, one line per check: PASS / FAIL / SKIP name: detail.

    bash benchmarks/gpu_check.sh              # on a machine with a GPU (<= 8 minutes)
    python benchmarks/gpu_check.py --device cpu   # dry run of what the CPU can run

Checks: Triton loss kernel with all its autotune configs (first, tuning call) against the
torch reference; flex attention forward and backward with the tile-built block mask
against dense SDPA; bf16 autocast drafter loss against fp32; the pipeline on CUDA
streams against the sequential loop; training with `model.compile=static|dynamic`
after warmup (no compile after step 1); NCCL `pairs` through torchrun when 2+ GPUs;
regenerate's compiled static-cache decoding against its eager decoder; flex masks of
sliding and causal layers; the step cost of each objective and of sliding layouts; the
production step at the published Qwen3-8B sizes (random bf16 weights built on the GPU).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
if "cpu" in sys.argv:  # the dry run: Triton's interpreter instead of a GPU driver
    os.environ.setdefault("TRITON_INTERPRET", "1")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402

RESULTS = []
TINY = ["data=synthetic", "data.num_samples=300", "eval.enabled=false", "logger.progress=false",
        "epochs=1", "optim.max_steps=12"]


def check(name):
    def wrap(fn):
        def run(*a):
            t0 = time.perf_counter()
            try:
                detail = fn(*a)
                status = "PASS"
                if detail.startswith("skip"):
                    status, detail = "SKIP", detail[len("skip"):].lstrip(": ")
            except Exception as exc:  # noqa: BLE001  (one line per check, whatever fails)
                status, detail = "FAIL", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                traceback.print_exc(file=sys.stderr)
            line = f"{status} {name}: {detail} ({time.perf_counter() - t0:.1f}s)"
            RESULTS.append(line)
            print(line, flush=True)
        return run
    return wrap


def _runner(overrides, out):
    from dflash.config import compose
    from dflash.trainer import Trainer
    topo = ["topology=single_gpu"] if torch.cuda.is_available() else []
    cfg = compose("train", [*TINY, *topo, *overrides])
    return Trainer(cfg, out).build()


@check("triton_ce_autotune")
def triton_ce(dev):
    from dflash.kernels import fused_lm_head_ce, naive_lm_head_ce
    from dflash.kernels.ce_triton import _ce_kernel
    worst = 0.0
    sizes = (151_936, 32_000, 997) if dev.type == "cuda" else (997,)
    for v in sizes:  # each size: its first call is the tuning one
        g = torch.Generator(device=dev).manual_seed(v)
        h = torch.randn(300, 64, device=dev, generator=g, requires_grad=True)
        w = torch.randn(v, 64, device=dev, generator=g) * 0.1
        y = torch.randint(0, v, (300,), device=dev, generator=g)
        wt = torch.rand(300, device=dev, generator=g)
        ref, _, _ = naive_lm_head_ce(h, w, y, wt)
        (rg,) = torch.autograd.grad(ref, h)
        loss, _, _ = fused_lm_head_ce(h, w, y, wt, chunk=128, impl="triton")
        (gr,) = torch.autograd.grad(loss, h)
        torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(gr, rg, rtol=1e-3, atol=1e-5)
        worst = max(worst, float((gr - rg).abs().max()))
    return f"{len(_ce_kernel.configs)} configs, first calls exact (max grad err {worst:.1e})"


def _flex_against_dense(dev, window=None, causal=False) -> bool:
    """The tile-built flex BlockMask (sliding `window`, `causal` blocks) against dense
    SDPA, forward, and backward where there is CUDA; whether gradients were compared."""
    from dflash.model.drafter import block_mask, flex_attention_fn, flex_block_mask
    g = torch.Generator(device=dev).manual_seed(0)
    b, s, a, bs = 2, 700, 40, 16
    anchors = torch.sort(torch.randint(0, s, (b, a), device=dev, generator=g), 1).values
    ok = torch.rand(b, a, device=dev, generator=g) > 0.1
    valid = torch.ones(b, s, dtype=torch.bool, device=dev)
    valid[1, 500:] = False
    dense = block_mask(anchors, ok, valid, bs, None, window, causal)
    bm = flex_block_mask(anchors, ok, valid, bs, None, window, causal)
    grad = dev.type == "cuda"  # no flex backward on the CPU
    q = torch.randn(b, 8, a * bs, 64, device=dev, generator=g, requires_grad=grad)
    k = torch.randn(b, 2, s + a * bs, 64, device=dev, generator=g, requires_grad=grad)
    v = torch.randn(b, 2, s + a * bs, 64, device=dev, generator=g, requires_grad=grad)
    out = flex_attention_fn(q.device)(q, k, v, block_mask=bm, enable_gqa=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_mask=dense[:, None])
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)
    if grad:
        go = torch.randn_like(out)
        for x, y in zip(torch.autograd.grad(out, (q, k, v), go),
                        torch.autograd.grad(ref, (q, k, v), go)):
            torch.testing.assert_close(x, y, rtol=5e-3, atol=5e-3)
    return grad


@check("flex_attention_fwd_bwd")
def flex(dev):
    if not _flex_against_dense(dev):
        return "skip: backward needs CUDA (the forward matched dense SDPA)"
    return "forward + backward match dense SDPA (40 anchors x 700 context)"


@check("flex_sliding_causal")
def flex_layouts(dev):
    """The flex BlockMask of sliding-window and causal layers against the dense mask."""
    done = []
    for window, causal in ((256, True), (None, True), (64, False)):
        _flex_against_dense(dev, window, causal)
        done.append(f"window {window} causal {causal}")
    how = " with gradients" if dev.type == "cuda" else " (forward)"
    return f"match dense SDPA{how}: " + ", ".join(done)


@check("objective_and_window_cost")
def objective_cost(dev):
    """Prints the step cost of loss=ce|dpace|kl and of sliding layouts at long rows."""
    if dev.type != "cuda":
        return "skip: the CPU figures are on the benchmarks page"
    out = []
    for script, args in (("bench_objectives.py", ["--reps", "5", "--vocab", "151936"]),
                         ("bench_layouts.py", ["--length", "8192", "--window", "2048", "--reps", "5"])):
        proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", script), *args],
                              cwd=REPO, text=True, capture_output=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-300:]
        print(proc.stdout, flush=True)
        out.append(proc.stdout.strip().splitlines()[-1])
    return "; ".join(out)


@check("bf16_autocast")
def bf16(dev):
    if dev.type != "cuda":
        return "skip: bf16 autocast is the CUDA path"
    from tests.helpers.batches import collate
    r = _runner(["model.autocast=bf16"], tempfile.mkdtemp())
    r32 = _runner(["model.autocast=off"], tempfile.mkdtemp())
    batch = r.shard(0)[0]
    m = r.train_step(collate(r.dataset, batch, dev))
    m32 = r32.train_step(collate(r32.dataset, batch, dev))
    a, b_ = float(m["loss"]), float(m32["loss"])
    assert abs(a - b_) / b_ < 0.02, (a, b_)
    assert r.drafter.fc.weight.dtype == torch.float32
    return f"bf16 loss {a:.4f} vs fp32 {b_:.4f}, fp32 master weights"


@check("pipeline_cuda_streams")
def pipeline(dev):
    from dflash.loggers import Logger
    out = {}
    for depth in (0, 2):
        r = _runner([f"pipeline.depth={depth}", "optim.max_steps=20"], tempfile.mkdtemp())
        s = r.train(Logger())
        out[depth] = (r.batches_seen, s["final_loss"], s["train_seconds"] / s["steps"], s["stage_ms"])
    assert out[0][0] == out[2][0], "batch order differs"
    rel = abs(out[0][1] - out[2][1]) / abs(out[0][1])
    assert rel < 1e-3, (out[0][1], out[2][1])
    st = out[2][3]
    return (f"same batches, loss {out[2][1]:.4f} vs {out[0][1]:.4f}; step {out[0][2]*1e3:.1f} -> "
            f"{out[2][2]*1e3:.1f} ms (target {st['time_target_ms']:.1f}, drafter "
            f"{st['time_drafter_ms']:.1f} ms)")


def _compiled(dev, mode):
    if dev.type != "cuda":
        return "skip: the compiled flex path needs CUDA (tests cover static on CPU with SDPA)"
    from dflash.loggers import Logger
    # top_k=4 (6 shapes with envelopes): a flex compile costs ~30 s per shape on an H200
    # (11 shapes took 330 s on 2026-12-04), so `all` would not fit the check's 8 minutes
    r = _runner([f"model.compile={mode}", "model.attention=flex", "warmup=top_k",
                 "warmup.top_k=4", "warmup.pad_to_multiple=64", "optim.max_steps=30"],
                tempfile.mkdtemp())
    s = r.train(Logger())
    assert s["compiles_after_warmup"] == 0, s["compile_events"]
    w = s["warmup"]
    return (f"{w['num_warm_shapes']} shapes warmed in {w['seconds']:.0f}s, 0 compiles after "
            f"warmup, peak {w.get('peak_memory_mb', 0):.0f} MB, {s['tokens_per_second']:.0f} tok/s")


@check("compile_static_flex")
def compiled_static(dev):
    return _compiled(dev, "static")


@check("compile_dynamic_flex")
def compiled_dynamic(dev):
    return _compiled(dev, "dynamic")


@check("step_cost_profile_and_prediction")
def step_cost(dev):
    """Profile the step on this GPU (bf16 target, autocast drafter), then train with the
    cost file and compare the predicted to the measured training time."""
    from dflash.config import compose
    from dflash.loggers import Logger
    from dflash.profile import run_profile
    topo = ["topology=single_gpu"] if dev.type == "cuda" else []
    out = tempfile.mkdtemp()
    common = [*TINY, *topo, "optim.max_steps=60", "warmup=all", "warmup.pad_to_multiple=64"]
    prof = run_profile(compose("profile", [*common, f"profile.out={out}/cost.json",
                                           "profile.max_shapes=16"]), out)
    r = _runner(["optim.max_steps=60", "warmup=all", "warmup.pad_to_multiple=64",
                 f"cost={out}/cost.json"], out)
    s = r.train(Logger())
    err = s["predicted_train_seconds"] / s["train_seconds"] - 1
    held = prof["fit"].get("heldout_mean_abs_error", float("nan"))
    return (f"{prof['num_points']} shapes, held-out error {100 * held:.1f}%; "
            f"{s['steps']} steps predicted {s['predicted_train_seconds']:.2f}s, measured "
            f"{s['train_seconds']:.2f}s ({100 * err:+.1f}%)")


@check("regenerate_compiled")
def regenerate_compiled(dev):
    """Greedy regeneration through transformers' static-cache compiled decoding (inductor
    on a GPU) against the eager speculative decoder (prompt lookup): the same tokens
    (fp32), and the generated tokens/s of each, timed after a warm call."""
    from omegaconf import OmegaConf
    from dflash.config import TargetConfig
    from dflash.decode.backend import Sampling
    from dflash.decode.local import Compiled, LocalBackend
    from dflash.model.target import Target
    target = Target.from_config(OmegaConf.structured(TargetConfig(dtype="float32"))).to(dev).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, target.vocab_size, (int(n),), generator=g).tolist()
               for n in torch.randint(8, 200, (16,), generator=g)]
    backend = "inductor" if dev.type == "cuda" else "eager"  # CPU dry run: no codegen
    outs, rates = {}, {}
    for name, compiled in (("eager", None), ("compiled", Compiled(backend, pad_to_multiple=64))):
        be = LocalBackend(target, [], Sampling(max_new_tokens=64), compiled=compiled)
        with torch.no_grad():
            be.decode_ids(prompts)  # the compiled path compiles its shape here
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs[name] = [o["ids"] for o in be.decode_ids(prompts)]
            if dev.type == "cuda":
                torch.cuda.synchronize()
        rates[name] = sum(map(len, outs[name])) / (time.perf_counter() - t0)
    same = sum(a == b for a, b in zip(outs["eager"], outs["compiled"]))
    assert same == len(prompts), f"{same}/{len(prompts)} rows equal"
    return (f"{same}/{len(prompts)} rows equal; {rates['eager']:,.0f} tok/s eager speculative, "
            f"{rates['compiled']:,.0f} tok/s compiled static cache ({backend})")


@check("nccl_pairs_torchrun")
def nccl(dev):
    n = torch.cuda.device_count() if dev.type == "cuda" else 0
    if n < 2:
        return f"skip: {n} GPU(s) visible, NCCL pairs need 2+"
    run = tempfile.mkdtemp()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "dflash.train",
         *TINY, "topology=pairs", f"hydra.run.dir={run}"], cwd=REPO, text=True,
        capture_output=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-500:]
    s = json.load(open(os.path.join(run, "summary.json")))
    assert len(set(s["replica_digests"])) == 1
    return f"2 ranks, {s['steps']} steps each, replicas identical ({s['replica_digests'][0]})"


QWEN3_8B = {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 12288, "vocab_size": 151936}
BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense, no sparsity


@check("production_shape_qwen3_8b")
def production_shape(dev):
    """The production step at the published Qwen3-8B sizes, random bf16 weights built on
    the GPU (no download): the 5-layer drafter, block 16, 512 anchors, token budget
    49,152 / 64 rows, seed6 buckets, flex attention, warmup=top_k (4 shapes: the compile
    seconds per shape decide what coverage would cost), one GPU for both
    stages. Real tokens/s, samples/s, peak memory, each stage's achieved TFLOP/s and its
    fraction of the chip's bf16 peak, compile seconds per warm shape."""
    if dev.type != "cuda":
        return "skip: needs a GPU (an 8B-size target)"
    from dflash.loggers import Logger
    out = tempfile.mkdtemp()
    sizes = [f"model.target.{k}={v}" for k, v in QWEN3_8B.items()]
    r = _runner(["experiment=production", "data=synthetic", "data.num_samples=4000",
                 "data.max_seq_len=3072", "logger=none", "model.target.path=null", *sizes,
                 "model.target.build_device=cuda", "optim.max_steps=40", "resume=never",
                 "checkpoint.every_minutes=0", "topology=single_gpu", "warmup=top_k",
                 "warmup.top_k=4"],
                out)
    torch.cuda.reset_peak_memory_stats(dev)
    s = r.train(Logger())
    steps, tok = s["steps"], s["real_tokens"]
    sm = s["stage_ms"]
    spec = r.drafter.spec
    # forward FLOPs: 2 x weights x tokens (the target stops after its last tapped layer);
    # the drafter trains (x3) over anchors x block positions per row, LM head included
    h, layers = QWEN3_8B["hidden_size"], max(spec.target_layer_ids) + 1
    per_layer = 2 * h * (h + 2 * 1024 + h) + 2 * 3 * h * QWEN3_8B["intermediate_size"]
    t_flops = per_layer * layers * tok / steps
    rows = tok / max(1, s["samples_seen"])  # mean real length
    pos = spec.num_anchors * spec.block_size * s["samples_seen"] / steps
    d_layer = 2 * h * (h + 2 * 1024 + h) + 2 * 3 * h * QWEN3_8B["intermediate_size"]
    d_flops = 3 * pos * (spec.num_layers * d_layer + 2 * h * QWEN3_8B["vocab_size"])
    name = torch.cuda.get_device_name(dev)
    peak = next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), float("nan"))
    t_tf = t_flops / (sm["time_target_ms"] / 1e3) / 1e12
    d_tf = d_flops / (sm["time_drafter_ms"] / 1e3) / 1e12
    w = s["warmup"]
    per_shape = w["seconds"] / max(1, w["num_warm_shapes"])
    real_peak = torch.cuda.max_memory_allocated(dev) / 2**30
    return (f"{steps} steps, {s['tokens_per_second']:,.0f} real tok/s, "
            f"{s['tokens_per_second'] / rows:.1f} samples/s at mean length {rows:.0f}; "
            f"peak {torch.cuda.max_memory_allocated(dev) / 2**30:.1f} GiB; target "
            f"{t_tf:.0f} TFLOP/s ({100 * t_tf / peak:.0f}% of {peak:.0f}), drafter {d_tf:.0f} "
            f"TFLOP/s ({100 * d_tf / peak:.0f}%); warmup {w['num_warm_shapes']} shapes, "
            f"{per_shape:.1f} s each; {s['compiles_after_warmup']} compiles after; "
            f"{_preflight_estimate(r, real_peak)}")


def _preflight_estimate(r, real_peak: float) -> str:
    """What `dflash.preflight` predicts for this run's largest warmed shape (fake tensors
    on the CPU side of this machine) beside the peak torch.cuda measured."""
    from dflash.model.target import tiny_qwen3_config
    from dflash.preflight.memory import estimate
    from omegaconf import OmegaConf
    cfg = OmegaConf.merge(r.cfg, {"model": {"autocast": "bf16"}})
    shape = max(r.shapes.warm, key=lambda x: (x.batch_size, x.tokens))
    est = estimate(tiny_qwen3_config(cfg.model.target), cfg, *shape.as_list(),
                   mask_token_id=r.drafter.spec.mask_token_id, shared=True)
    gib = est.target_gib + est.drafter_gib
    return (f"preflight estimate {gib:.1f} GiB at {shape.as_list()} against "
            f"max_memory_allocated {real_peak:.1f} GiB ({100 * (gib / real_peak - 1):+.0f}%)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(ap.parse_args().device)
    if dev.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
              f"{torch.cuda.device_count()} GPU(s)", flush=True)
    # cheapest first; the production shape first among the expensive ones; the compile
    # checks take minutes and come last
    for fn in (triton_ce, flex, flex_layouts, bf16, production_shape, step_cost, pipeline, nccl,
               objective_cost, regenerate_compiled, compiled_dynamic, compiled_static):
        fn(dev)
    failed = [r for r in RESULTS if r.startswith("FAIL")]
    print(f"{len(RESULTS) - len(failed)}/{len(RESULTS)} checks without failure")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
