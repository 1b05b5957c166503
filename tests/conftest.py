import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from dflash import config  # noqa: E402

config.register()  # the apps do this at start; tests compose the same schemas


def pytest_collection_modifyitems(config, items):
    """Everything under tests/integration is `slow` (`make test-fast` leaves it out)."""
    for item in items:
        if f"{os.sep}integration{os.sep}" in str(item.fspath):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def world_cache(tmp_path_factory):
    """Shared data cache: the fitted world target, and the compile caches warmup uses.
    DFLASH_TEST_CACHE=DIR keeps it between sessions (a rerun skips the ~1 min world fit);
    CI leaves it unset, so every run fits from scratch."""
    keep = os.environ.get("DFLASH_TEST_CACHE")
    if keep:
        from pathlib import Path
        Path(keep).mkdir(parents=True, exist_ok=True)
        return Path(keep)
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
