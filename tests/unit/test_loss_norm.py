"""loss.norm: with `plan` a supervised block counts the same whatever batch it lands
in; with `batch` (the old per-batch mean) its weight depends on its batch-mates."""
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dflash.config import DrafterConfig, TargetConfig
from dflash.data.format import DatasetWriter, TokenDataset
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.loss import Objective, anchor_candidates, drafter_loss, sample_anchors
from dflash.model.target import Target


@pytest.fixture(scope="module")
def models():
    target = Target.from_config(OmegaConf.structured(TargetConfig()))
    torch.manual_seed(0)
    drafter = DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig())))
    return target, drafter


def _batch(lengths, seed):
    """Right-padded rows: random tokens, the second half of each row supervised."""
    g = torch.Generator().manual_seed(seed)
    s = max(lengths)
    ids = torch.randint(3, 500, (len(lengths), s), generator=g)
    valid = torch.arange(s)[None] < torch.tensor(lengths)[:, None]
    mask = (torch.arange(s)[None] >= torch.tensor(lengths)[:, None] // 2) & valid
    return ids, mask, valid


def _shared_block_grad(models, ids, mask, valid, objective):
    """d loss / d (drafter output) of row 0's blocks: the weight the loss gives them."""
    target, drafter = models
    anchors, ok = sample_anchors(mask, valid, 8, torch.Generator().manual_seed(1))
    anchors[0], ok[0] = torch.tensor([20, 24, 28, 32, 0, 0, 0, 0]), torch.tensor([True] * 4 + [False] * 4)
    seen = []

    def keep(module, inputs, out):  # returns None: the output is left as it is
        out.retain_grad()
        seen.append(out)
    hook = drafter.register_forward_hook(keep)
    try:
        out = drafter_loss(drafter, target.context(ids, valid.long()), target.embed_tokens,
                           target.lm_head_weight, ids, mask, valid, objective, anchors=(anchors, ok))
        drafter.zero_grad()
        out.loss.backward()
    finally:
        hook.remove()
    return seen[0].grad[0, :4].clone(), out


@pytest.mark.parametrize("norm", ["plan", "batch"])
def test_a_block_weighs_the_same_in_a_short_batch_and_a_long_one(models, norm):
    shared = 48  # row 0: the same sample, the same anchors, in both batches
    short_ids, short_mask, short_valid = _batch([shared] + [40] * 63, seed=0)   # 64 rows
    long_ids, long_mask, long_valid = _batch([shared] + [400] * 10, seed=1)     # 11 rows
    long_ids[0, :shared] = short_ids[0, :shared]
    ob = Objective(8, norm=norm, batch_weight=500.0)
    g_short, o_short = _shared_block_grad(models, short_ids, short_mask, short_valid, ob)
    g_long, o_long = _shared_block_grad(models, long_ids, long_mask, long_valid, ob)
    assert int(o_long.blocks) != int(o_short.blocks)  # batch-mates differ in weight
    if norm == "plan":
        torch.testing.assert_close(g_long, g_short, rtol=1e-4, atol=1e-9)
    else:  # the old per-batch mean: the block weighs 1 / (its batch's total weight)
        ratio = float(g_short.norm() / g_long.norm())
        assert abs(ratio - 1) > 0.5, ratio
    # what is logged is the weighted mean CE either way
    assert float(o_short.ce) > 0 and torch.isfinite(o_long.ce)


def test_data_set_anchor_candidates_match_the_trainers_rule(tmp_path):
    rng = np.random.default_rng(0)
    w = DatasetWriter(tmp_path / "ds", vocab_size=50)
    rows = []
    for n in rng.integers(2, 40, 30):
        tok = rng.integers(0, 50, n)
        mask = rng.random(n) < 0.6
        w.add(tok, mask)
        rows.append(mask)
    w.close()
    got = TokenDataset.open(tmp_path / "ds").anchor_candidates(chunk=17)  # chunks cut samples
    for i, m in enumerate(rows):
        t = torch.as_tensor(m)[None]
        assert got[i] == int(anchor_candidates(t, torch.ones_like(t)).sum()), i
    assert got.dtype == np.int64


def test_plan_weight_is_the_mean_batch_weight_and_bad_settings_are_named():
    from dflash.batching.epoch_plan import EpochPlan
    lengths = np.array([10, 20, 30, 40], dtype=np.int64)
    plan = EpochPlan.build(0, np.arange(4), np.array([0, 1, 4]), np.zeros(2, np.int32), lengths)
    ob = Objective(8, gamma=7.0)
    per_block = ob.block_weight(16)
    assert ob.expected_batch_weight(np.array([3, 100, 0, 5]), plan, 16) == pytest.approx(
        (3 + 8 + 0 + 5) * per_block / 2)
    with pytest.raises(ValueError, match="loss.norm"):
        Objective(8, norm="tokens")
    with pytest.raises(ValueError, match="positive batch_weight"):
        Objective(8, norm="plan", batch_weight=0.0)
