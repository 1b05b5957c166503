"""The wheel carries everything the apps need: built without -e, installed on its own,
then each command starts and runs from another directory."""
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers.paths import REPO
from tests.helpers.run import WORLD


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package as `pip install .` puts it (pip builds the wheel, then installs it),
    into its own dir."""
    import shutil
    site = tmp_path_factory.mktemp("site")
    src = tmp_path_factory.mktemp("src")  # setuptools builds in the source tree: a copy
    shutil.copytree(REPO / "dflash", src / "dflash", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                    "-q", "--target", str(site), str(src)], check=True, timeout=300,
                   capture_output=True)
    # the distribution is dflash-trainer ("dflash" on PyPI is the public reference package)
    assert list(site.glob("dflash_trainer-*.dist-info")) and not list(site.glob("__editable__*"))
    return site


def _app(site, cwd, module, *args):
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
           "WANDB_MODE": "disabled", "HOME": str(cwd)}
    probe = subprocess.run([sys.executable, "-c", "import dflash; print(dflash.__file__)"],
                           cwd=cwd, env=env, text=True, capture_output=True, check=True)
    assert probe.stdout.startswith(str(site)), probe.stdout  # the wheel, not the checkout
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def test_installed_wheel_runs_every_app(installed, tmp_path, world_cache):
    def yamls(root):
        return sorted(str(p.relative_to(root)) for p in (root / "dflash" / "conf").rglob("*.yaml"))
    assert yamls(installed) == yamls(REPO) and len(yamls(REPO)) > 30
    np.save(tmp_path / "len.npy", np.random.default_rng(0).integers(65, 4000, 3000))
    plan = _app(installed, tmp_path, "dflash.plan", f"lengths_file={tmp_path}/len.npy",
                "buckets=seed6", f"report={tmp_path}/r.json", f"hydra.run.dir={tmp_path}/p")
    assert (tmp_path / "r.json").exists() and "padding" in plan.stdout
    _app(installed, tmp_path, "dflash.buckets", f"lengths_file={tmp_path}/len.npy",
         "num_buckets=4", "refine=false", f"out={tmp_path}/b.yaml", f"hydra.run.dir={tmp_path}/b")
    assert "boundaries" in (tmp_path / "b.yaml").read_text()
    _app(installed, tmp_path, "dflash.train", *WORLD, f"data.cache_dir={world_cache}",
         "epochs=1", "optim.max_steps=2", "eval.enabled=false", "warmup=none",
         "logger.progress=false", f"hydra.run.dir={tmp_path}/t")
    assert (tmp_path / "t" / "summary.json").exists()
    assert (tmp_path / "t" / "drafter" / "model.safetensors").exists()
