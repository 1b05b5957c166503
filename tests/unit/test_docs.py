"""The docs' figures come from `benchmarks/figures.sh`: every benchmark a page cites is one
of its figures, and every figure it names runs a script that exists."""
import re
import subprocess

from tests.helpers.paths import REPO


def _figures() -> list[str]:
    out = subprocess.run(["bash", str(REPO / "benchmarks" / "figures.sh"), "--list"],
                         capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.split()


def test_every_benchmark_the_docs_cite_is_a_figure_the_script_reruns():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    cited = {m for p in pages for m in re.findall(r"benchmarks/(\w+)\.py", p.read_text())}
    names = _figures()
    assert len(cited) > 10 and cited <= set(names), sorted(cited - set(names))
    for name in names:  # a bench_* figure runs benchmarks/NAME.py
        if name.startswith("bench_") or name == "tp_memory":
            assert (REPO / "benchmarks" / f"{name}.py").exists(), name
    assert len(names) == len(set(names))
