"""Layers import only downward: the import contract in pyproject.toml holds, and it
fails when a lower layer imports from a higher one."""
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO


def _lint(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` with the project's contract, over the package found in `root`."""
    cmd = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command;"
           " sys.exit(lint_imports_command())", "--config", str(REPO / "pyproject.toml"),
           "--no-cache"]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    return subprocess.run(cmd, cwd=root, env=env, text=True, capture_output=True, timeout=120)


def test_the_package_keeps_its_layers():
    proc = _lint(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout
    assert "ignored" not in proc.stdout  # no import is let through the contract


def test_an_upward_import_breaks_the_contract(tmp_path):
    shutil.copytree(REPO / "dflash", tmp_path / "dflash",
                    ignore=shutil.ignore_patterns("__pycache__"))
    low = tmp_path / "dflash" / "data" / "format.py"  # data: the lowest package layer
    low.write_text(low.read_text() + "\nfrom dflash.trainer import Trainer  # noqa\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0
    assert "BROKEN" in proc.stdout and "dflash.data.format -> dflash.trainer" in proc.stdout
