import json

import numpy as np
import pytest

from dflash.batching import DataError
from dflash.data.format import DatasetWriter, TokenDataset
from dflash.data.overlong import apply_to_lengths
from dflash.data.prepare import prepare
from dflash.data.synthetic import ASSISTANT_ID, MarkovSource, build_synthetic, synthetic_lengths
from dflash.errors import ConfigError


def _write(path, samples, vocab=100):
    w = DatasetWriter(path, vocab)
    for t in samples:
        w.add(np.array(t), np.ones(len(t)))
    return w.close()


def test_round_trip_and_collate(tmp_path):
    ds = _write(tmp_path / "d", [[1, 2, 3], [4, 5], [6]])
    again = TokenDataset.open(tmp_path / "d")
    assert again.lengths.tolist() == [3, 2, 1] and again.lengths.dtype == np.int64
    assert isinstance(again.tokens, np.memmap)
    ids, mask, valid = again.collate([1, 0], seq_len=3)
    assert ids.tolist() == [[4, 5, 0], [1, 2, 3]]
    assert valid.sum() == 5 and mask.sum() == 5
    assert ds.max_token_id == 6


@pytest.mark.parametrize("damage,match", [
    (lambda p: (p / "meta.json").unlink(), "missing meta.json"),
    (lambda p: (p / "meta.json").write_text("{not json"), "meta.json is corrupt"),
    (lambda p: (p / "tokens.bin").write_bytes(b"\0" * 5), "tokens.bin is corrupt: 5 bytes"),
    (lambda p: (p / "loss_mask.bin").unlink(), "loss_mask.bin is missing"),
    (lambda p: np.save(p / "offsets.npy", np.array([0, 2, 6])), "does not match meta.json"),
    (lambda p: (p / "offsets.npy").write_bytes(b"garbage"), "offsets.npy is corrupt"),
])
def test_damaged_dataset_names_the_file(tmp_path, damage, match):
    _write(tmp_path / "d", [[1, 2, 3], [4, 5], [6]])
    damage(tmp_path / "d")
    with pytest.raises(DataError, match=match):
        TokenDataset.open(tmp_path / "d")


def test_missing_dir_and_bad_tokens(tmp_path):
    with pytest.raises(DataError, match="not found"):
        TokenDataset.open(tmp_path / "nope")
    w = DatasetWriter(tmp_path / "v", vocab_size=10)
    w.add(np.array([1, 2]), np.array([1, 1]))
    with pytest.raises(DataError, match="sample 1: token id 10 outside the vocabulary"):
        w.add(np.array([10]), np.array([1]))
    ds = _write(tmp_path / "x", [[1, 2], [3, 90]])
    with pytest.raises(DataError, match="sample 1 holds token id 90 outside the model vocabulary of 50"):
        ds.check_vocab(50)


def test_overlong_policies():
    lengths = np.array([5, 50, 7, 60])
    new, keep, rep = apply_to_lengths(lengths, 10, "truncate")
    assert new.tolist() == [5, 10, 7, 10] and rep.count == 2 and rep.tokens_removed == 90
    new, keep, rep = apply_to_lengths(lengths, 10, "drop")
    assert new.tolist() == [5, 7] and keep.tolist() == [0, 2] and rep.count == 2
    with pytest.raises(DataError, match="sample 1 has 50 tokens, more than data.max_seq_len=10"):
        apply_to_lengths(lengths, 10, "error")
    with pytest.raises(ConfigError, match="data.overlong must be one of"):
        apply_to_lengths(lengths, 10, "cut")
    # dropping every sample leaves nothing to plan: refused with the shortest sample
    with pytest.raises(DataError, match=r"would drop all 4 samples \(the shortest has 5 tokens"):
        apply_to_lengths(lengths, 4, "drop")


def test_synthetic_tokens_are_markov_and_masked(tmp_path):
    lengths = synthetic_lengths(300, 0.05, 16, seed=1)
    ds = build_synthetic(300, 0.05, 16, 128, 1, lengths, tmp_path)
    assert np.array_equal(ds.lengths, lengths)
    src = MarkovSource(128, 1)
    t, m = ds.sample(7)
    a = int(np.flatnonzero(t == ASSISTANT_ID)[0])
    assert m[:a + 1].sum() == 0 and m[a + 1:].all()
    # every transition in the reply is one of the token's 4 successors
    reply = t[a + 1:]
    assert all(reply[i + 1] in src.succ[reply[i]] for i in range(len(reply) - 1))
    # cached: a second build reopens the same files
    assert build_synthetic(300, 0.05, 16, 128, 1, lengths, tmp_path).path == ds.path


def _jsonl(path, convs):
    path.write_text("\n".join(json.dumps({"messages": c}) for c in convs) + "\n")
    return path


def test_prepare_masks_assistant_tokens_only(tmp_path, chat_tokenizer):
    convs = [
        [{"role": "user", "content": "w1 w2"}, {"role": "assistant", "content": "w3 w4 w5"}],
        [{"role": "system", "content": "w9"}, {"role": "user", "content": "w1"},
         {"role": "assistant", "content": "w6"}, {"role": "user", "content": "w7"},
         {"role": "assistant", "content": "w8 w8"}],
    ]
    ds, summary = prepare(_jsonl(tmp_path / "c.jsonl", convs), chat_tokenizer, tmp_path / "out")
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(chat_tokenizer))
    t, m = ds.sample(0)
    supervised = tok.convert_ids_to_tokens(t[m.astype(bool)].tolist())
    assert supervised == ["w3", "w4", "w5", "<|im_end|>"]
    t, m = ds.sample(1)
    assert tok.convert_ids_to_tokens(t[m.astype(bool)].tolist()) == [
        "w6", "<|im_end|>", "w8", "w8", "<|im_end|>"]
    assert summary["samples"] == 2 and summary["overlong_samples"] == 0


def test_prepare_overlong_and_bad_lines(tmp_path, chat_tokenizer):
    long = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": " ".join(["w2"] * 40)}]
    short = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]
    f = _jsonl(tmp_path / "c.jsonl", [short, long])
    with pytest.raises(DataError, match=r"c.jsonl:2: \d+ tokens, more than max_seq_len=20"):
        prepare(f, chat_tokenizer, tmp_path / "e", max_seq_len=20, overlong="error")
    ds, s = prepare(f, chat_tokenizer, tmp_path / "d", max_seq_len=20, overlong="drop")
    assert len(ds) == 1 and s["overlong_samples"] == 1
    ds, s = prepare(f, chat_tokenizer, tmp_path / "t", max_seq_len=20, overlong="truncate")
    assert ds.lengths.tolist()[1] == 20 and s["overlong_samples"] == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": short}) + "\n{oops\n")
    with pytest.raises(DataError, match="bad.jsonl:2: invalid JSON"):
        prepare(bad, chat_tokenizer, tmp_path / "b", bad_lines="error")
    with pytest.raises(DataError, match="JSONL file not found"):
        prepare(tmp_path / "none.jsonl", chat_tokenizer, tmp_path / "n")
    with pytest.raises(DataError, match="tokenizer directory not found"):
        prepare(f, tmp_path / "no-tok", tmp_path / "n")
    # settings and an --out that cannot work: refused before a line is read
    with pytest.raises(ConfigError, match="--max-seq-len must be >= 1"):
        prepare(f, chat_tokenizer, tmp_path / "n", max_seq_len=0)
    with pytest.raises(ConfigError, match="c.jsonl: a file; the data set is a directory"):
        prepare(f, chat_tokenizer, f)
    assert f.read_text().count("\n") == 2  # the input itself untouched


def test_prepare_handles_templates_that_rewrite_past_turns(tmp_path, chat_tokenizer):
    """Like Qwen3 stripping past reasoning: earlier assistant turns render differently
    from how a prefix render shows them, so only content lookup places the mask right."""
    import shutil
    from transformers import AutoTokenizer
    quirky = tmp_path / "quirky"
    shutil.copytree(chat_tokenizer, quirky)
    tok = AutoTokenizer.from_pretrained(str(quirky))
    tok.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} "
        "{% if m['role'] == 'assistant' and not loop.last %}w199 {% endif %}"
        "{{ m['content'] }} <|im_end|> {% endfor %}")
    tok.save_pretrained(quirky)
    conv = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2 w3"},
            {"role": "user", "content": "w4"}, {"role": "assistant", "content": "w5"}]
    ds, _ = prepare(_jsonl(tmp_path / "c.jsonl", [conv]), quirky, tmp_path / "out")
    t, m = ds.sample(0)
    words = tok.convert_ids_to_tokens(t.tolist())
    assert [w for w, k in zip(words, m) if k] == ["w2", "w3", "<|im_end|>", "w5", "<|im_end|>"]
    assert "w199" in words  # the rewrite is there, and unsupervised


@pytest.mark.slow  # a spawned worker pool (make test-fast stays under a minute)
def test_prepare_with_workers_matches_single_process(tmp_path, chat_tokenizer):
    rng = np.random.default_rng(1)
    convs = [[{"role": "user", "content": " ".join(f"w{i}" for i in rng.integers(0, 200, 5))},
              {"role": "assistant", "content": " ".join(f"w{i}" for i in rng.integers(0, 200, 9))}]
             for _ in range(150)]
    f = _jsonl(tmp_path / "c.jsonl", convs)
    one, _ = prepare(f, chat_tokenizer, tmp_path / "one")
    two, _ = prepare(f, chat_tokenizer, tmp_path / "two", workers=2)
    assert np.array_equal(one.tokens, two.tokens) and np.array_equal(one.loss_mask, two.loss_mask)
    assert np.array_equal(one.offsets, two.offsets)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f.read_text() + '{"messages": [{"role": "user"}]}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:151: message 0 needs 'role' and a string"):
        prepare(bad, chat_tokenizer, tmp_path / "b", workers=2, bad_lines="error")


def test_a_set_holding_the_mask_token_is_refused_naming_the_sample(tmp_path):
    ds = _write(tmp_path / "m", [[1, 2, 3], [4, 5], [6, 97, 97], [97]])
    with pytest.raises(DataError, match=r"sample 2 holds token id 97, the drafter's mask token "
                                        r"\(model.drafter.mask_token_id; 3 occurrences"):
        ds.check_absent(97, "model.drafter.mask_token_id")
    ds.check_absent(98, "model.drafter.mask_token_id")  # absent: passes


def test_the_default_mask_token_is_a_row_the_tokenizer_never_emits(tmp_path, chat_tokenizer):
    from transformers import AutoTokenizer
    from dflash.data.mask_token import default_mask_token
    tok = AutoTokenizer.from_pretrained(str(chat_tokenizer))
    assert default_mask_token(512, None) == 511  # no tokenizer: the last row
    assert default_mask_token(512, tok) == len(tok)  # a padded vocabulary: the first spare row
    # a full vocabulary: its last row is a word; the highest reserved special token that
    # no chat turn renders is taken instead (<|im_start|>/<|im_end|>/<pad> are rendered)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>",
                                                          "<|reserved_a|>", "<|reserved_b|>"]})
    reserved = tok.convert_tokens_to_ids("<|reserved_b|>")
    assert default_mask_token(len(tok), tok) == reserved
    assert tok.convert_ids_to_tokens(len(tok) - 1) == "<|reserved_b|>"  # (added last)
    tok.add_tokens(["ectable"])  # a real word in the last row
    assert default_mask_token(len(tok), tok) == reserved != len(tok) - 1
