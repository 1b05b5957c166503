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


def _write_atomic(path: Path, data: bytes) -> None:
    """Write then rename: test workers extracting the same file at once never read a
    half-written one."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


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
            _write_atomic(out, z.read("dflash/model.py"))
    spec = importlib.util.spec_from_file_location(NAME, out)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = mod
    spec.loader.exec_module(mod)
    return mod


def reference_drafter(path):
    """The reference model built from a dflash export's config, with its weights."""
    import json

    from safetensors.torch import load_file
    from transformers import Qwen3Config
    ref = reference_model()
    model = ref.DFlashDraftModel(Qwen3Config(**json.loads((Path(path) / "config.json").read_text())))
    missing, unexpected = model.load_state_dict(load_file(str(Path(path) / "model.safetensors")),
                                                strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model.float().eval()


def same_blocks(ours, ref, seq: int = 30, anchors=(3, 11, 17, 29), seed: int = 1) -> float:
    """Max abs difference of dflash's drafter and the reference on the same random
    context and block inputs (the reference drafts one block at a time after its context)."""
    import torch
    spec = ours.spec
    ours = ours.float().eval()
    g = torch.Generator().manual_seed(seed)
    bs, h = spec.block_size, spec.hidden_size
    ctx = torch.randn(1, seq, len(spec.target_layer_ids) * h, generator=g)
    a = torch.tensor([list(anchors)])
    emb = torch.randn(1, a.shape[1], bs, h, generator=g)
    worst = 0.0
    with torch.no_grad():
        got = ours(ctx, torch.ones(1, seq, dtype=torch.bool), a,
                   torch.ones_like(a, dtype=torch.bool), emb)
        for j, x in enumerate(a[0].tolist()):
            want = ref(position_ids=torch.arange(x + bs)[None], noise_embedding=emb[:, j],
                       target_hidden=ctx[:, :x])
            worst = max(worst, (got[:, j] - want).abs().max().item())
    return worst


SPECFORGE = "specforge_dflash_reader"


def specforge_model():
    """SpecForge 0.2.0's DFlash draft model file (with the two files it imports beside it),
    from its wheel in .venv/reference/ (make test downloads it, never installed)."""
    if SPECFORGE in sys.modules:
        return sys.modules[f"{SPECFORGE}.dflash"]
    wheels = sorted((REPO / ".venv" / "reference").glob("specforge-0.2.0-*.whl"))
    if not wheels:
        pytest.fail("the SpecForge wheel is missing: `pip download --no-deps specforge==0.2.0 "
                    "-d .venv/reference` (make test does it)", pytrace=False)
    pkg = REPO / ".venv" / "reference" / SPECFORGE
    if not (pkg / "dflash.py").exists():
        pkg.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as z:
            _write_atomic(pkg / "__init__.py", b"")
            for name in ("dflash_kernels.py", "registry.py", "dflash.py"):  # dflash.py last
                _write_atomic(pkg / name, z.read(f"specforge/modeling/draft/{name}"))
    sys.path.insert(0, str(pkg.parent))
    try:
        return importlib.import_module(f"{SPECFORGE}.dflash")
    finally:
        sys.path.remove(str(pkg.parent))


def specforge_drafter(path):
    """SpecForge's DFlashDraftModel built from a dflash export's config, with its weights."""
    import json

    from safetensors.torch import load_file
    from transformers import Qwen3Config
    model = specforge_model().DFlashDraftModel(
        Qwen3Config(**json.loads((Path(path) / "config.json").read_text())))
    missing, unexpected = model.load_state_dict(load_file(str(Path(path) / "model.safetensors")),
                                                strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model.float().eval()
