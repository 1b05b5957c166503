"""`python -m dflash.end_to_end` (`make train-real`): a drafter for a real chat model, start
to finish, each stage one of dflash's own apps (the stages: dflash/recipe/run.py).

Every stage's config is composed and checked before the first stage runs; a rerun skips
each stage done with the same command; `workdir/summary.json` gathers what each measured.
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from dflash import config
from dflash.errors import hydra_dirs_checked, user_errors_exit
from dflash.recipe.run import run
from dflash.recipe.summary import format_summary

config.register()


@hydra_dirs_checked
@hydra.main(config_path="conf", config_name="end_to_end", version_base="1.3")
@user_errors_exit
def main(cfg: DictConfig) -> None:
    print(format_summary(run(cfg)))


if __name__ == "__main__":
    main()
