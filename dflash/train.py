"""`python -m dflash.train`: the main job.

Today it builds the data set and the epoch plan from the config groups, checks them
against the model's vocabulary, and reports the plan. The training loop (target ->
drafter pipeline, warmup, logging) plugs in behind `run_plan_stage`; until it does this
command does not train and says so.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import config as _config  # noqa: F401  (registers the schemas)
from .batching.report import format_report
from .data.build import load_data
from .model.target import target_vocab_size
from .plan import report_for

log = logging.getLogger("dflash.train")


def run_plan_stage(cfg: DictConfig, out_dir: Path) -> dict:
    vocab = target_vocab_size(cfg.model.target)  # fail on a bad model path before data work
    data = load_data(cfg.data, need_tokens=True)
    data.dataset.check_vocab(vocab)
    report = report_for(cfg, data)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plan_report.json").write_text(json.dumps(report, indent=2))
    return report


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    report = run_plan_stage(cfg, out_dir)
    print(format_report(report))
    log.warning("the training loop is not part of this build yet: data and plan were built "
                "and checked (%s), no drafter was trained", out_dir / "plan_report.json")


if __name__ == "__main__":
    main()
