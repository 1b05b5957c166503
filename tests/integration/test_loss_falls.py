"""The path the runner drives, end to end on CPU: plan -> Batch -> collate -> frozen
target -> drafter loss -> optimizer step, on synthetic Markov data."""
import numpy as np
import torch
from omegaconf import OmegaConf

from dflash.batching import PackingSpec, Planner
from dflash.batching.boundaries import computed_boundaries
from dflash.config import DrafterConfig, TargetConfig
from dflash.data.synthetic import build_synthetic, synthetic_lengths
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.loss import Objective, drafter_loss
from dflash.model.target import Target


def test_loss_falls_on_planned_synthetic_batches(tmp_path):
    lengths = synthetic_lengths(400, 0.03, 24, seed=0)
    ds = build_synthetic(400, 0.03, 24, 48, 0, lengths, tmp_path)  # few states: quick to learn
    target = Target.from_config(OmegaConf.structured(TargetConfig()))
    ds.check_vocab(target.vocab_size)
    # a real target is a trained LM: fit the tiny one to this data first (random LM heads
    # give near-flat logits that a drafter needs many steps to overcome)
    from tests.helpers.quick_train import fit_target_lm
    rows = [ds.sample(i)[0][:32] for i in range(len(ds)) if ds.lengths[i] >= 32]
    # 90 steps: the drafter's loss then falls to 0.78 of its start (0.76 after 150)
    fit_target_lm(target, torch.as_tensor(np.stack(rows), dtype=torch.long), steps=90)
    torch.manual_seed(0)
    drafter = DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig())))
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    planner = Planner("bucketed", ds.lengths, computed_boundaries("quantile", ds.lengths, 3),
                      PackingSpec(2048, 16), seed=0)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for epoch in range(3):
        for batch in planner.epoch(epoch).batches():
            ids, mask, valid = (torch.from_numpy(a) for a in ds.collate(batch.sample_ids, batch.seq_len))
            assert ids.shape == batch.shape
            out = drafter_loss(drafter, target.context(ids, valid.long()), target.embed_tokens,
                               target.lm_head_weight, ids, mask, valid, Objective(16), gen)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            losses.append(out.loss.item())
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert last < 0.85 * first, (first, last)
