"""Generate the config-groups page from dflash/conf at build time (mkdocs-gen-files), so
it cannot drift: every group, every option with its file's header comment, and each
app's default choice (read from the app's defaults list)."""
from __future__ import annotations

from pathlib import Path

import yaml

CONF = Path(__file__).resolve().parents[1] / "dflash" / "conf"
APPS = ("train", "regenerate", "eval", "plan", "profile", "bucket_fit", "end_to_end")


def header(path: Path) -> str:
    """The option file's leading comment (its `# @package` line left out)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if not text.startswith("@package"):
            lines.append(text)
    return " ".join(lines).replace("|", "\\|")


def app_defaults() -> dict:
    """group -> {app: its default option}, from each app's defaults list (train's via
    train_defaults.yaml)."""
    out: dict = {}
    for app in APPS:
        f = CONF / f"{app}.yaml"
        if not f.exists():
            continue
        entries = list(yaml.safe_load(f.read_text()).get("defaults", []))
        if "train_defaults" in entries:
            entries += yaml.safe_load((CONF / "train_defaults.yaml").read_text())["defaults"]
        for e in entries:
            if not isinstance(e, dict):
                continue
            for key, value in e.items():
                group = key.replace("optional ", "").replace("override ", "").strip("/")
                if (CONF / group).is_dir() and value not in (None, "null"):
                    out.setdefault(group, {})[app] = value
    return out


def page() -> str:
    defaults = app_defaults()
    lines = ["# Config groups", "",
             "Generated from `dflash/conf/` when the site is built (`docs/gen_config_groups.py`): "
             "each group, its options with their own header comment, and the option each app "
             "starts from. Every key an option sets is in the "
             "[configuration reference](reference/config.md). Choose one on the command line "
             "(`batching=random`); `experiment=` options are recipes that set several groups "
             "(`# @package _global_`).", ""]
    for group in sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra"):
        used = defaults.get(group, {})
        by = ", ".join(f"{app}: `{opt}`" for app, opt in used.items()) or "none (opt in)"
        lines += [f"## `{group}`", "", f"Default: {by}.", "", "| option | what it is |",
                  "| --- | --- |"]
        for f in sorted((CONF / group).glob("*.yaml")):
            lines.append(f"| `{group}={f.stem}` | {header(f) or '-'} |")
        lines.append("")
    return "\n".join(lines)


try:
    import mkdocs_gen_files
    with mkdocs_gen_files.open("config-groups.md", "w") as fh:
        fh.write(page())
except ImportError:  # run directly: print it
    if __name__ == "__main__":
        print(page())
