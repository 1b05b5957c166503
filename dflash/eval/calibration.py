"""How far a DSpark confidence head can be trusted: predicted against observed acceptance.

The head's sigmoid at slot k reads as the chance the slot's draft is accepted given the
drafts before it were. On given continuations (the held-out prompts followed by the
tokens greedy decoding produced) every block whose drafts before slot k were all right
is one trial at k: the head's prediction there against whether the draft was right.
Per slot: trials, mean predicted, observed, and the expected calibration error over all
slots (|predicted - observed| in ten bins of the prediction, weighted by trials).
"""
from __future__ import annotations

import numpy as np
import torch

from dflash.eval.teacher_forced import _blocks


@torch.no_grad()
def confidence_calibration(target, drafter, sequences, prompt_lengths, batch_size: int = 8) -> dict:
    if drafter.confidence_head is None:
        return {}
    head, mh = target.lm_head_weight, drafter.markov_head
    preds, hits, slots, n = [], [], [], 0
    for _, _, hidden, targets, sup, prev in _blocks(target, drafter, sequences, prompt_lengths,
                                                   batch_size):
        z = (hidden.to(head.dtype) @ head.t()).float() + mh.full(prev, head.shape[0]).float()
        right = (z.argmax(-1) == targets) & sup
        conf = torch.sigmoid(drafter.confidence_head(hidden, mh.markov_w1(prev)).float())
        # a trial at k: supervised, and every earlier slot of the block right
        before = torch.cumprod(right.long(), -1)
        alive = sup & torch.cat([torch.ones_like(before[..., :1]), before[..., :-1]], -1).bool()
        n = sup.shape[-1]
        k = torch.arange(n, device=sup.device).expand_as(sup)
        preds.append(conf[alive].cpu()), hits.append(right[alive].cpu()), slots.append(k[alive].cpu())
    if not preds:
        return {}
    p, h, k = (torch.cat(x).numpy() for x in (preds, hits, slots))
    per = []
    for s in range(n):  # every slot, a slot no block reached with 0 trials
        m = k == s
        per.append({"slot": s + 1, "trials": int(m.sum()),
                    "predicted": float(p[m].mean()) if m.any() else None,
                    "observed": float(h[m].mean()) if m.any() else None})
    bins = np.minimum((p * 10).astype(np.int64), 9)
    ece = sum(abs(p[bins == b].mean() - h[bins == b].mean()) * (bins == b).sum()
              for b in range(10) if (bins == b).any()) / max(1, len(p))
    return {"per_slot": per, "ece": float(ece), "trials": int(len(p))}


def format_calibration(c: dict) -> str:
    if not c:
        return ""
    rows = [r for r in c["per_slot"] if r["trials"]]
    return "\n".join(
        [f"confidence head: calibration over {c['trials']} trials (ECE {c['ece']:.3f})",
         "  slot k: " + " ".join(f"{r['slot']:>5}" for r in rows),
         "  trials: " + " ".join(f"{r['trials']:>5}" for r in rows),
         "  pred.:  " + " ".join(f"{r['predicted']:5.2f}" for r in rows),
         "  obs.:   " + " ".join(f"{r['observed']:5.2f}" for r in rows)])
