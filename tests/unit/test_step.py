"""The training step: mixed precision and no host synchronisation."""
import pytest
import torch
from omegaconf import OmegaConf

from dflash.config import DrafterConfig, TargetConfig
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.loss import Objective, drafter_loss, sample_anchors
from dflash.model.target import Target
from dflash.optim import warmup_cosine
from dflash.step import DeviceBatch, StepPolicy, TrainStep


def _batch(s=48):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (2, s), generator=g)
    mask = torch.zeros(2, s, dtype=torch.bool)
    mask[:, 12:] = True
    valid = torch.ones(2, s, dtype=torch.bool)
    valid[1, 40:] = False
    return ids, mask & valid, valid


def _drafter(target):
    torch.manual_seed(0)
    return DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig())))


def test_bf16_target_with_fp32_drafter_matches_fp32():
    fp32 = Target.from_config(OmegaConf.structured(TargetConfig()))
    bf16 = Target.from_config(OmegaConf.structured(TargetConfig(dtype="bfloat16")))
    drafter = _drafter(fp32)
    ids, mask, valid = _batch()
    anchors = sample_anchors(mask, valid, 8, torch.Generator().manual_seed(1))
    ref = drafter_loss(drafter, fp32.context(ids, valid.long()), fp32.embed_tokens,
                       fp32.lm_head_weight, ids, mask, valid, Objective(8), anchors=anchors)
    # without autocast (the crash users hit: bf16 context into fp32 weights) ...
    plain = drafter_loss(drafter, bf16.context(ids, valid.long()), bf16.embed_tokens,
                         bf16.lm_head_weight, ids, mask, valid, Objective(8), anchors=anchors)
    # ... and under bf16 autocast, as on GPU
    with torch.autocast("cpu", dtype=torch.bfloat16):
        amp = drafter_loss(drafter, bf16.context(ids, valid.long()), bf16.embed_tokens,
                           bf16.lm_head_weight, ids, mask, valid, Objective(8), anchors=anchors)
    for out in (plain, amp):
        assert torch.isfinite(out.loss)
        assert abs(float(out.loss.detach()) - float(ref.loss.detach())) < 0.02 * float(ref.loss.detach())
    amp.loss.backward()
    assert drafter.fc.weight.dtype == torch.float32 and drafter.fc.weight.grad.dtype == torch.float32
    assert torch.isfinite(drafter.fc.weight.grad).all()


def test_step_updates_with_bf16_autocast_on_cpu():
    target = Target.from_config(OmegaConf.structured(TargetConfig(dtype="bfloat16")))
    drafter = _drafter(target)
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    step = TrainStep(target, drafter, opt, sched, Objective(8),
                     StepPolicy(grad_clip=1.0, autocast="bf16"))
    before = drafter.fc.weight.detach().clone()
    ids, mask, valid = _batch()
    m = step(DeviceBatch(None, ids, mask, valid))
    assert torch.isfinite(m["loss"]) and not torch.equal(before, drafter.fc.weight)


def test_bf16_is_called_emulated_only_on_an_x86_cpu_without_bf16_dot_products(monkeypatch):
    from dflash import step as step_mod
    monkeypatch.setattr(step_mod.platform, "machine", lambda: "x86_64")
    for avx512_bf16, amx, emulated in ((False, False, True), (True, False, False),
                                       (False, True, False)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16,
                            raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
        assert step_mod.emulated_bf16(torch.device("cpu")) is emulated
    assert not step_mod.emulated_bf16(torch.device("meta"))
    monkeypatch.setattr(step_mod.platform, "machine", lambda: "arm64")
    assert not step_mod.emulated_bf16(torch.device("cpu"))


def test_step_never_reads_back_to_the_host(monkeypatch):
    """A step that calls .item() / .tolist() / bool(tensor) stalls the GPU every step."""
    target = Target.from_config(OmegaConf.structured(TargetConfig()))
    drafter = _drafter(target)
    # on CPU `auto` picks the chunked mask, which reads its window widths back by design
    # (free on CPU, where nothing runs ahead); the backends CUDA uses must never sync
    drafter.set_attention("sdpa")
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-3, foreach=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    step = TrainStep(target, drafter, opt, sched, Objective(8), StepPolicy(grad_clip=1.0))
    ids, mask, valid = _batch()
    b = DeviceBatch(None, ids, mask, valid)
    ctx = step.context(b)

    def boom(*_a, **_k):
        raise AssertionError("host synchronisation inside the drafter step")
    calls = []
    # AdamW's own step counter is a host tensor on CPU (a device tensor with fused=True
    # on GPU): the optimizer is left out of the guarded region
    monkeypatch.setattr(step.optimizer, "step", lambda: calls.append(1))
    for name in ("item", "tolist", "__bool__", "numpy", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    m = step.drafter_step(b, ctx)
    monkeypatch.undo()
    assert calls == [1] and torch.isfinite(m["loss"])
    assert drafter.fc.weight.grad is not None


@pytest.mark.parametrize("total,ratio", [(100, 0.04), (10, 0.5), (1, 0.04)])
def test_warmup_cosine_schedule(total, ratio):
    lrs = [warmup_cosine(s, total, ratio) for s in range(total)]
    warm = max(1, -(-int(total * ratio * 1000) // 1000))
    assert lrs[0] == pytest.approx(1 / max(1, round(total * ratio + 0.4999)))
    assert max(lrs) == pytest.approx(1.0) and lrs[-1] <= lrs[min(warm, total - 1)]
    assert all(0 <= x <= 1 for x in lrs)


def test_the_emulated_bf16_warning_names_what_to_set_for_the_keys_given(monkeypatch):
    from dflash import step as step_mod
    monkeypatch.setattr(step_mod, "emulated_bf16", lambda device: True)
    cpu = torch.device("cpu")
    assert step_mod.emulated_bf16_warning([], cpu) is None
    line = step_mod.emulated_bf16_warning(["model.target.dtype"], cpu)
    assert line.startswith("model.target.dtype: bf16")
    assert line.endswith("set model.target.dtype=float32")
    both = step_mod.emulated_bf16_warning(["model.autocast", "model.target.dtype"], cpu)
    assert both.endswith("set model.autocast=off model.target.dtype=float32")
    monkeypatch.setattr(step_mod, "emulated_bf16", lambda device: False)
    assert step_mod.emulated_bf16_warning(["model.autocast"], cpu) is None
