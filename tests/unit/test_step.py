"""The training step: mixed precision and no host synchronisation."""
import math

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


def test_a_right_padded_rows_context_is_each_sample_alone():
    """The step runs the target on right-padded rows without a padding mask: under the
    causal mask no real token sees a pad, so each row's real positions read what the
    sample alone gives (a padding row included: nothing of it is read)."""
    target = Target.from_config(OmegaConf.structured(TargetConfig()))
    step = TrainStep(target, _drafter(target), None, None, Objective(8), StepPolicy())
    ids, mask, valid = _batch()
    valid[0, 30:] = False
    valid = torch.cat([valid, torch.zeros(1, valid.shape[1], dtype=torch.bool)])
    ids, mask = torch.cat([ids, ids[:1]]), torch.cat([mask, mask[:1] & False])
    ctx = step.context(DeviceBatch(None, ids, mask & valid, valid))
    for row in range(2):
        n = int(valid[row].sum())
        alone = target.context(ids[row:row + 1, :n])[0]
        torch.testing.assert_close(ctx[row, :n], alone, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(ctx).all()


@pytest.mark.parametrize("total,ratio", [(100, 0.04), (10, 0.5), (1, 0.04)])
def test_warmup_cosine_schedule(total, ratio):
    lrs = [warmup_cosine(s, total, ratio) for s in range(total)]
    warm = max(1, -(-int(total * ratio * 1000) // 1000))
    assert lrs[0] == pytest.approx(1 / max(1, round(total * ratio + 0.4999)))
    assert max(lrs) == pytest.approx(1.0) and lrs[-1] <= lrs[min(warm, total - 1)]
    assert all(0 <= x <= 1 for x in lrs)


def test_the_world_targets_schedule_ramps_and_decays_at_once():
    """decay_during_warmup (the world target's fit): the warmup ramp scales a cosine over
    every step, instead of the cosine starting after the ramp."""
    lrs = [warmup_cosine(s, 300, 0.0, warmup_steps=30, decay_during_warmup=True)
           for s in range(300)]
    assert lrs[0] == pytest.approx(1 / 30 * 1.0) and lrs[29] < 1.0  # decayed while ramping
    assert lrs[9] == pytest.approx(10 / 30 * 0.5 * (1 + math.cos(math.pi * 9 / 300)))
    assert lrs[-1] < 1e-3 and all(a >= b for a, b in zip(lrs[30:], lrs[31:]))
    assert warmup_cosine(29, 300, 0.0, warmup_steps=30) == 1.0  # the other rule: ramp, then cosine


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


def _micro_rows_equal_whole_batch(kind, make_drafter, rtol: float = 1e-5, w_atol: float = 1e-6):
    """Two steps of the whole batch and of micro rows of 2, from the same drafter: the
    same loss, logged figures and weights (to `rtol` of the figures, `w_atol` of a weight)."""
    target = Target.from_config(OmegaConf.structured(TargetConfig()))
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 500, (5, 40), generator=g)
    valid = torch.ones(5, 40, dtype=torch.bool)
    valid[3, 25:] = False
    mask = torch.zeros(5, 40, dtype=torch.bool)
    mask[:, 6:] = True
    mask &= valid
    runs = []
    for micro in (0, 2):
        drafter = make_drafter(target)
        # SGD: the update is the gradient itself (AdamW's first steps take its sign, which
        # a last-bit difference flips where a gradient is ~0)
        opt = torch.optim.SGD(drafter.parameters(), lr=0.5)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        ob = Objective(8, norm="plan", batch_weight=40.0, kind=kind)
        step = TrainStep(target, drafter, opt, sched, ob, StepPolicy(micro_rows=micro),
                         generator=torch.Generator().manual_seed(7))
        b = DeviceBatch(None, ids, mask, valid)
        ctx = target.context(ids, valid.long(), final=kind in ("kl", "dspark"))
        out = [step.drafter_step(b, ctx) for _ in range(2)]
        runs.append((out, {k: v.detach().clone() for k, v in drafter.state_dict().items()}))
    (whole, w_whole), (micro, w_micro) = runs
    for a, b in zip(whole, micro):
        for key in ("loss", "accept_est", "acc", "grad_norm", "rows"):
            assert torch.allclose(a[key].float(), b[key].float(), rtol=rtol, atol=1e-5), key
    for k in w_whole:
        assert torch.allclose(w_whole[k], w_micro[k], atol=w_atol), k


@pytest.mark.parametrize("kind", ["ce", "kl"])
def test_micro_rows_take_the_same_step_as_the_whole_batch(kind):
    """optim.micro_rows: the rows in slices, gradients accumulated, one update: the same
    anchors, loss, logged figures and weights as the whole batch at once."""
    _micro_rows_equal_whole_batch(kind, _drafter)


def test_micro_rows_refuse_a_loss_normalised_by_the_whole_batch():
    from dflash.errors import ConfigError
    target = Target.from_config(OmegaConf.structured(TargetConfig()))
    drafter = _drafter(target)
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    step = TrainStep(target, drafter, opt, sched, Objective(8, norm="batch"),
                     StepPolicy(micro_rows=1))
    ids, mask, valid = _batch()
    with pytest.raises(ConfigError, match="optim.micro_rows needs loss.norm=plan"):
        step.drafter_step(DeviceBatch(None, ids, mask, valid), target.context(ids, valid.long()))


def test_micro_rows_take_the_same_dspark_step_as_the_whole_batch():
    """loss=dspark divides by the slot weight of the whole step, which the data alone
    decides: computed before the slices run, the sliced step equals the whole one, the
    Markov and confidence heads' updates included."""
    def dspark(target):
        torch.manual_seed(0)
        drafter = DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(
            DrafterConfig(markov_rank=8, confidence_head=True))))
        torch.nn.init.normal_(drafter.markov_head.markov_w2.weight, std=0.5)  # (zero at init)
        return drafter
    # slice by slice the gradients sum in another order: on an AVX2-only CPU the gradient
    # norm came 3.4e-5 apart relatively and a weight 7.3e-6 after two steps at lr 0.5
    # (on AVX512-BF16 within 1e-5 and 1e-6)
    _micro_rows_equal_whole_batch("dspark", dspark, rtol=1e-4, w_atol=2e-5)
