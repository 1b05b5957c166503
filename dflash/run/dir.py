"""What a training run writes into its run dir, and the names it logs under.

    summary.json          the summary (non-finite floats as null)
    drafter/              the final drafter in the public DFlash layout
    drafter_draft_vocab/  with loss.draft_vocab: the same drafter with its LM head cut to
                          the draft vocabulary (lm_head.weight + d2t), for engines
    resolved_config.yaml  the fully resolved config
    eval_prompts.jsonl    the held-out prompts ({"prompt_ids": [...]} per line)
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from omegaconf import OmegaConf

from dflash.model.checkpoint import save_drafter
from dflash.model.draft_head import save_draft_head
from dflash.run_summary import check_summary


def write_summary(out_dir: Path, summary: dict) -> None:
    check_summary(summary)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(finite(summary), indent=2))


def write_run_dir(out_dir: Path, drafter, resolved: dict, eval_prompts, summary: dict,
                  dtype=None, draft_head=None) -> None:
    """`draft_head`: (the training's draft vocabulary ids, the target's LM head), written
    as drafter_draft_vocab/ beside drafter/ (dflash/model/draft_head.py)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    save_drafter(drafter, out_dir / "drafter", dtype)
    if draft_head is not None:
        save_draft_head(out_dir / "drafter", out_dir / "drafter_draft_vocab", *draft_head)
    (out_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(resolved))
    with open(out_dir / "eval_prompts.jsonl", "w") as f:
        for p in eval_prompts:
            f.write(json.dumps({"prompt_ids": [int(t) for t in p]}) + "\n")
    write_summary(out_dir, summary)


def run_names(logger_cfg) -> dict:
    """W&B run name and group: the config's, else the Hydra job's overrides and, in a
    multirun, the sweep dir's name (so sequential jobs of one sweep share a group)."""
    name, group = logger_cfg.get("run_name"), logger_cfg.get("group")
    try:
        from hydra.core.hydra_config import HydraConfig
        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return {"run_name": name, "group": group, "overrides": []}
    overrides = hc.job.override_dirname or hc.job.name
    if str(hc.mode) == "RunMode.MULTIRUN":
        group = group or Path(hc.sweep.dir).name
        name = name or f"{hc.job.num}_{overrides}"
    # the overrides that name the job (conf/hydra/output: not `resume`, so the jobs of a
    # stopped sweep's rerun still group with the ones it reused)
    skip = set(hc.job.config.override_dirname.exclude_keys)
    task = [o for o in hc.overrides.task if o.split("=", 1)[0].lstrip("+~") not in skip]
    return {"run_name": name or overrides, "group": group, "overrides": task}


def finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


def to_log_file(text: str) -> None:
    """`text` into the run's log file (Hydra's `train.log`, which holds the run's logged
    warnings and notes) too, without printing it twice on the console."""
    import logging
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler) and h.stream is not None:
            h.acquire()
            try:
                h.stream.write(text + "\n")
                h.flush()
            finally:
                h.release()
