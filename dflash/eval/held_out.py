"""A training run's measurement on its held-out prompts: decoded acceptance (before,
during and after training), and after training the teacher-forced estimate along the
decoded tokens and, for a drafter with a confidence head, its calibration."""
from __future__ import annotations

from dflash.eval.calibration import confidence_calibration
from dflash.decode import evaluate
from dflash.eval.teacher_forced import teacher_forced_acceptance


def held_out_report(target, drafter, prompts, eval_cfg, teacher_forced: bool = False,
                    progress: str | None = None) -> dict:
    """`eval.*` on `prompts` ({} when eval is off or there are none). `progress`: a
    progress bar's label (the evaluations before and after training take minutes on a
    real model)."""
    e = eval_cfg
    if not e.enabled or not prompts:
        return {}
    r = evaluate(target, drafter, prompts, int(e.max_new_tokens),
                 temperature=float(e.temperature), batch_size=int(e.batch_size),
                 seed=int(e.seed), eos_token_id=getattr(target.config, "eos_token_id", None),
                 confidence_stop=float(e.confidence_stop), progress=progress)
    out = r.as_dict()
    if teacher_forced:
        seqs = [list(map(int, p)) + t for p, t in zip(prompts, r.tokens)]
        starts = [len(p) for p in prompts]
        out["teacher_forced"] = teacher_forced_acceptance(target, drafter, seqs, starts,
                                                          batch_size=int(e.batch_size))
        if drafter.confidence_head is not None:  # DSpark: is its confidence right?
            out["calibration"] = confidence_calibration(target, drafter, seqs, starts,
                                                        batch_size=int(e.batch_size))
    return out
