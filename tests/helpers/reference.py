"""The public reference drafter (z-lab `dflash` 0.1.0 on PyPI): its model file, loaded
under another name (the package's import name is this project's). `make test` downloads
the wheel to .venv/reference/ (never installed); DFLASH_REFERENCE_WHEEL names another."""
from __future__ import annotations

import importlib.util
import os
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

NAME = "zlab_dflash_reference"


def reference_model():
    """The reference's `dflash/model.py` as a module (DFlashDraftModel, dflash_generate)."""
    if NAME in sys.modules:
        return sys.modules[NAME]
    wheels = ([Path(os.environ["DFLASH_REFERENCE_WHEEL"])] if "DFLASH_REFERENCE_WHEEL" in os.environ
              else sorted((REPO / ".venv" / "reference").glob("dflash-0.1.0-*.whl")))
    if not wheels or not wheels[0].exists():
        pytest.fail("the reference drafter wheel is missing: `pip download --no-deps "
                    "dflash==0.1.0 -d .venv/reference` (make test does it)", pytrace=False)
    out = REPO / ".venv" / "reference" / "model.py"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as z:
            out.write_bytes(z.read("dflash/model.py"))
    spec = importlib.util.spec_from_file_location(NAME, out)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = mod
    spec.loader.exec_module(mod)
    return mod
