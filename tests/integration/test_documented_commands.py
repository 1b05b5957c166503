"""Every command the README and the docs show, run through preflight in the world its
text states, against the small files of the real models it names (no weights): a
documented command that would be refused, or run a real target on CPU or in float32 on
a GPU, fails here."""
import re

import pytest

from dflash.preflight.checks import Session, check
from dflash.preflight.command import parse
from dflash.preflight.documented import documented_commands
from dflash.preflight.world import World
from tests.helpers.model_fixtures import MODELS, write_model
from tests.helpers.paths import REPO

ALL = documented_commands(REPO)
# a command shown on several pages is checked once (in the same world it is the same
# check; the session already holds what an earlier occurrence's guide wrote)
COMMANDS = [c for i, c in enumerate(ALL)
            if (c.text, c.world) not in {(d.text, d.world) for d in ALL[:i]}]
DEFAULT_MODEL = "Qwen3-8B"  # the docs' /models/MyModel


def _with_fixtures(text: str, models) -> str:
    """The command with every model path pointing at the fixture of the model it names
    (by the path's last part; any other path: the default model)."""
    def repl(m):
        name = m[2].rstrip("/").rsplit("/", 1)[-1]
        return f"{m[1]}{models(name if name in MODELS else DEFAULT_MODEL)}"
    text = re.sub(r"(model\.target\.path=)(\S+)", repl, text)
    text = re.sub(r"((?:--tokenizer|target=)\s*)(/models/\S+|path/to/tokenizer\S*)", repl, text)
    return re.sub(r"(DFLASH_TARGET_PATH=)(\S+)", repl, text)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    made = {}

    def get(name):
        if name not in made:
            made[name] = write_model(root, name)
        return made[name]
    return get


@pytest.fixture(scope="module")
def reports(models, tmp_path_factory):
    """Every command checked once, in the docs' order, in one session (as a user follows a
    guide: a preset an earlier command writes is there for a later one), whichever
    worker or order the tests below run in: {command: its report or the error it raised}."""
    import os
    session, out, here = Session(), {}, os.getcwd()
    os.chdir(tmp_path_factory.mktemp("guide"))  # run dirs and resume=auto look here
    try:
        for doc in COMMANDS:
            try:
                out[str(doc)] = check(parse(_with_fixtures(doc.text, models)),
                                      World.parse(doc.world), session)
            except Exception as exc:  # noqa: BLE001  (failed by its own test below)
                out[str(doc)] = exc
    finally:
        os.chdir(here)
    return out


def test_the_docs_show_the_commands_a_user_needs():
    texts = " ".join(c.text for c in ALL)
    for app in ("dflash.train", "dflash.regenerate", "dflash.eval", "dflash.data.prepare",
                "dflash.plan", "dflash.buckets", "make train-real", "torchrun --nnodes"):
        assert app in texts, app
    assert len(ALL) >= 30 and len(COMMANDS) < len(ALL)


@pytest.mark.parametrize("doc", COMMANDS, ids=str)
def test_a_documented_command_passes_preflight(doc, reports):
    rep = reports[str(doc)]
    if isinstance(rep, Exception):
        raise rep
    assert rep.ok, f"{doc} ({doc.world}): {doc.text}\n{rep.format()}"
