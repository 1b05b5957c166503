"""The preflight table of every documented command: each command of README.md and
docs/*.md run through `dflash.preflight` in the world its text states, against the
config and tokenizer files of the real models it names (written from their public
configs: tests/helpers/model_fixtures.py; no weights). What the doc test asserts, as one
table: command, world, peak memory a GPU (target / drafter), verdict.

    python benchmarks/preflight_docs.py [--all]   # --all: the CPU commands too
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="the CPU-world commands too")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    from dflash.preflight.checks import Session, check
    from dflash.preflight.command import parse
    from dflash.preflight.documented import documented_commands
    from dflash.preflight.report import table
    from dflash.preflight.world import World
    from tests.integration.test_documented_commands import _with_fixtures
    from tests.helpers.model_fixtures import write_model
    docs = documented_commands(REPO)
    root, made = Path(tempfile.mkdtemp()), {}

    def model(name):
        if name not in made:
            made[name] = write_model(root, name)
        return made[name]
    os.chdir(tempfile.mkdtemp())  # run dirs resolve here, not in the repository
    session, reports = Session(), []
    for doc in docs:
        rep = check(parse(_with_fixtures(doc.text, model)), World.parse(doc.world), session)
        rep.command = f"{doc}: {doc.text}"
        if args.all or doc.world != "cpu":
            reports.append(rep)
    print(table(reports).replace(str(root) + "/", "/models/"))


if __name__ == "__main__":
    main()
