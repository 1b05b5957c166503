import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dflash import config  # noqa: E402

config.register()  # the apps do this at start; tests compose the same schemas

REPO = Path(__file__).resolve().parents[1]
# one small world for the whole session: its target is fitted once, then cached
WORLD = ["data.num_samples=400", "data.target_fit_steps=350", "eval.num_prompts=6",
         "eval.max_new_tokens=32"]


@pytest.fixture(scope="session")
def world_cache(tmp_path_factory):
    """Shared data cache: the fitted world target, and the compile caches warmup uses."""
    return tmp_path_factory.mktemp("world-cache")


def run_module(module, *args, check=True):
    """`python -m module args...` in the repository, as a user would run it."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stdout + proc.stderr)
    return proc


def reference_pack(lengths, budget, cap):
    """The packing rule of DESIGN.md, one sample at a time."""
    offsets, count, cur = [0], 0, 0
    for i, n in enumerate(lengths):
        if count < cap and (count + 1) * max(cur, n) <= budget:
            count, cur = count + 1, max(cur, n)
        else:
            offsets.append(i)
            count, cur = 1, n
    offsets.append(len(lengths))
    return np.asarray(offsets, dtype=np.int64)


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
