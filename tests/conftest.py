import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # workers share the cores: a worker's torch (and every process its tests start)
    # takes one thread, not one a core each (oversubscribed threads spin and stall)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from dflash import config  # noqa: E402
from tests.helpers.ranks import ranks_from_a_forkserver  # noqa: E402

config.register()  # the apps do this at start; tests compose the same schemas
ranks_from_a_forkserver()  # mp.spawn's ranks start with torch and dflash imported


def _integration(item) -> bool:
    return f"{os.sep}integration{os.sep}" in str(item.fspath)


# The heaviest integration files go to the workers first, so the workers finish together
# instead of one running a 2-minute file alone at the end; a heavy file that needs no
# fitted world comes second, so one worker has work while the other fits the world
# (seconds each took on a 2-core AVX2 machine, 2026-12-07: 548 s of suite before). The
# order holds only under `--no-loadscope-reorder` (make test): xdist otherwise hands the
# files with the most tests out first, and the world fit started a minute in
HEAVY = ("test_train_run.py",  # 130 s, fits the world
         "test_regenerate_app.py",  # 55 s, no world
         "test_family_rehearsal.py",  # 50 s, no world
         "test_resume.py", "test_resume_ranks.py",  # 90 s, 85 s
         "test_documented_commands.py",  # 40 s, no world
         "test_loss_norm_ddp.py", "test_target_tp.py", "test_warmup_run.py",  # 66, 60, 55 s
         "test_preflight.py", "test_packed_training.py", "test_lossless_decoding.py",
         "test_loss_falls.py")


def _order(item) -> tuple:
    if not _integration(item):
        return (0, 0)
    name = Path(str(item.fspath)).name
    return (1, HEAVY.index(name) if name in HEAVY else len(HEAVY))


def pytest_collection_modifyitems(config, items):
    """Everything under tests/integration is `slow` (`make test-fast` leaves it out) and
    runs after the unit tests, so a failing unit test answers in the first minute, the
    heaviest integration files first (HEAVY). (The
    world fit does not run in the background beside them: on 2 cores two torch
    processes oversubscribe the threads; measured, no faster beside the unit tests and
    70 s slower beside the integration tests that do not need the world.)"""
    for item in items:
        if _integration(item):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_order)  # stable: each module's tests stay together, in order


@pytest.fixture(scope="session")
def world_cache(tmp_path_factory):
    """Shared data cache: the fitted world target, and the compile caches warmup uses.
    DFLASH_TEST_CACHE=DIR keeps it between sessions (a rerun skips the ~1 min world fit);
    CI leaves it unset, so every run fits from scratch."""
    keep = os.environ.get("DFLASH_TEST_CACHE")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        return Path(keep)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one cache for every worker of this run
        shared = tmp_path_factory.getbasetemp().parent / "world-cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("world-cache")


@pytest.fixture(scope="session")
def full_lengths():
    from dflash.data.synthetic import production_lengths
    return production_lengths()


@pytest.fixture(scope="session")
def chat_tokenizer(tmp_path_factory):
    """A real HF fast tokenizer with a chat template, built locally (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system",
             "\n"] + [f"w{i}" for i in range(200)]
    vocab = {w: i for i, w in enumerate(words)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
        "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(path)
    return path
