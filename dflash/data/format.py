"""On-disk tokenized data set: flat memory-mapped tokens and loss mask, per-sample offsets.

    DIR/meta.json      format, version, counts, vocab size, largest token id
    DIR/tokens.bin     int32 token ids, all samples concatenated
    DIR/loss_mask.bin  uint8, 1 where the token is supervised (assistant text)
    DIR/offsets.npy    int64 [num_samples + 1]

Opening is O(1) in the token count (memory maps), so ~1M samples load instantly;
lengths are derived once from the offsets.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dflash.errors import DataError

FORMAT = "dflash-tokens"
VERSION = 1
TOKEN_DTYPE = np.int32


class TokenDataset:
    def __init__(self, path: Path, tokens: np.ndarray, loss_mask: np.ndarray,
                 offsets: np.ndarray, meta: dict):
        self.path = path
        self.tokens = tokens
        self.loss_mask = loss_mask
        self.offsets = offsets
        self.meta = meta
        self.lengths = np.diff(offsets).astype(np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def max_token_id(self) -> int:
        return int(self.meta["max_token_id"])

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.offsets[i], self.offsets[i + 1]
        return self.tokens[lo:hi], self.loss_mask[lo:hi]

    def anchor_candidates(self, chunk: int = 1 << 24) -> np.ndarray:
        """Per sample (int64): positions a with loss_mask[a] and loss_mask[a+1] inside the
        sample, where a block may be anchored. One streaming pass over the mask."""
        out = np.zeros(len(self), dtype=np.int64)
        n_tok = int(self.offsets[-1])
        for lo in range(0, n_tok, chunk):
            hi = min(n_tok, lo + chunk + 1)
            m = np.asarray(self.loss_mask[lo:hi], dtype=bool)
            pair = m[:-1] & m[1:]  # pair[j]: positions lo+j and lo+j+1
            pos = np.flatnonzero(pair) + lo
            # a pair that straddles two samples is not a candidate
            sample = np.searchsorted(self.offsets, pos, side="right") - 1
            inside = pos + 1 < self.offsets[sample + 1]
            out += np.bincount(sample[inside], minlength=len(self)).astype(np.int64)
        return out

    def supervised_counts(self, num_samples: int | None = None,
                          chunk: int = 1 << 24) -> np.ndarray:
        """int64 [vocab_size]: how often each token id is supervised (loss_mask) in the
        first `num_samples` samples (all: None). One streaming pass."""
        n = len(self) if num_samples is None else int(num_samples)
        end = int(self.offsets[n])
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for lo in range(0, end, chunk):
            hi = min(end, lo + chunk)
            toks = np.asarray(self.tokens[lo:hi], dtype=np.int64)
            out += np.bincount(toks[np.asarray(self.loss_mask[lo:hi], dtype=bool)],
                               minlength=self.vocab_size).astype(np.int64)
        return out

    def collate(self, sample_ids, seq_len: int, pad_id: int = 0):
        """Right-padded [B, seq_len] token ids, loss mask and validity mask (numpy)."""
        b = len(sample_ids)
        ids = np.full((b, seq_len), pad_id, dtype=np.int64)
        mask = np.zeros((b, seq_len), dtype=np.bool_)
        valid = np.zeros((b, seq_len), dtype=np.bool_)
        for r, i in enumerate(sample_ids):
            t, m = self.sample(int(i))
            n = len(t)
            if n > seq_len:
                raise DataError(f"{self.path}: sample {int(i)} has {n} tokens, more than the "
                                f"batch's padded length {seq_len}")
            ids[r, :n] = t
            mask[r, :n] = m
            valid[r, :n] = True
        return ids, mask, valid

    def collate_batch(self, batch, rows: int, seq_len: int):
        """Host arrays for a planned batch: (ids, loss mask, valid), and per-document
        position ids when the batch is packed (then already `rows` x `seq_len`)."""
        if batch.row_of is not None:
            return self.collate_packed(batch.sample_ids, batch.row_of, rows, seq_len)
        return self.collate(batch.sample_ids, seq_len)

    def collate_packed(self, sample_ids, row_of, num_rows: int, row_len: int, pad_id: int = 0):
        """Packed [rows, row_len] ids, loss mask, validity and per-document position ids:
        the samples of each row side by side, positions restarting at 0 for each (the
        padding at a row's end is one more run of positions, never valid)."""
        ids = np.full((num_rows, row_len), pad_id, dtype=np.int64)
        mask = np.zeros((num_rows, row_len), dtype=np.bool_)
        valid = np.zeros((num_rows, row_len), dtype=np.bool_)
        pos = np.tile(np.arange(row_len, dtype=np.int64), (num_rows, 1))
        fill = np.zeros(num_rows, dtype=np.int64)
        for i, r in zip(sample_ids, row_of):
            t, m = self.sample(int(i))
            lo, n = int(fill[r]), len(t)
            if lo + n > row_len:
                raise DataError(f"{self.path}: sample {int(i)} ({n} tokens) does not fit in "
                                f"row {int(r)} of length {row_len} at offset {lo}")
            ids[r, lo:lo + n], mask[r, lo:lo + n], valid[r, lo:lo + n] = t, m, True
            pos[r, lo:lo + n] = np.arange(n)
            fill[r] = lo + n
        for r in range(num_rows):  # the tail restarts too: it is no document's continuation
            pos[r, fill[r]:] = np.arange(row_len - fill[r])
        return ids, mask, valid, pos

    def check_vocab(self, vocab_size: int) -> None:
        """Fail before training if any token id cannot index the model's embedding."""
        if self.max_token_id >= vocab_size:  # meta.json records the largest id: O(1) check
            per_sample = np.maximum.reduceat(self.tokens, self.offsets[:-1])
            bad = int(np.argmax(per_sample >= vocab_size))
            raise DataError(f"{self.path}: sample {bad} holds token id {int(per_sample[bad])} "
                            f"outside the model vocabulary of {vocab_size} "
                            f"({int((per_sample >= vocab_size).sum())} samples affected)")

    def check_absent(self, token_id: int, key: str) -> None:
        """Fail before training if a sample holds `token_id` (the drafter's mask token:
        a block input that is also real text makes every draft ambiguous). One pass over
        the token file, in chunks, so a memory-mapped set is never read whole."""
        step, first, total = 1 << 26, None, 0
        for start in range(0, len(self.tokens), step):
            hits = np.flatnonzero(np.asarray(self.tokens[start:start + step]) == token_id)
            if len(hits) and first is None:
                first = start + int(hits[0])
            total += len(hits)
        if first is not None:
            sample = int(np.searchsorted(self.offsets, first, side="right")) - 1
            raise DataError(f"{self.path}: sample {sample} holds token id {token_id}, the "
                            f"drafter's mask token ({key}; {total} occurrences in the set); "
                            "set it to an id the data never uses: a row past the tokenizer's "
                            "(151669 for Qwen3) or a reserved special token no chat renders "
                            "(left null, dflash picks one from the data's tokenizer)")

    @classmethod
    def open(cls, path: str | Path) -> "TokenDataset":
        path = Path(path)
        meta_file = path / "meta.json"
        if not path.is_dir():
            raise DataError(f"data set directory not found: {path}")
        if not meta_file.exists():
            raise DataError(f"{path} is not a dflash data set: missing meta.json "
                            "(write one with `python -m dflash.data.prepare`)")
        try:
            meta = json.loads(meta_file.read_text())
        except json.JSONDecodeError as exc:
            raise DataError(f"{meta_file} is corrupt: {exc}") from exc
        for key in ("format", "version", "num_samples", "num_tokens", "vocab_size", "max_token_id"):
            if key not in meta:
                raise DataError(f"{meta_file} is missing key '{key}'")
        if meta["format"] != FORMAT or meta["version"] != VERSION:
            raise DataError(f"{meta_file}: unsupported format {meta['format']} v{meta['version']}")
        n_tok, n = int(meta["num_tokens"]), int(meta["num_samples"])
        tokens = _map(path / "tokens.bin", TOKEN_DTYPE, n_tok)
        loss_mask = _map(path / "loss_mask.bin", np.uint8, n_tok)
        off_file = path / "offsets.npy"
        if not off_file.exists():
            raise DataError(f"{off_file} is missing")
        try:
            offsets = np.load(off_file, mmap_mode="r", allow_pickle=False)
        except Exception as exc:
            raise DataError(f"{off_file} is corrupt: {exc}") from exc
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.shape != (n + 1,) or offsets[0] != 0 or offsets[-1] != n_tok:
            raise DataError(f"{off_file} does not match meta.json: expected {n + 1} offsets "
                            f"from 0 to {n_tok}, got shape {offsets.shape}")
        steps = np.diff(offsets)
        if (steps < 1).any():
            raise DataError(f"{off_file}: sample {int(np.argmax(steps < 1))} is empty or "
                            "offsets decrease")
        return cls(path, tokens, loss_mask, offsets, meta)


def _map(file: Path, dtype, count: int) -> np.ndarray:
    if not file.exists():
        raise DataError(f"{file} is missing")
    expected = count * np.dtype(dtype).itemsize
    actual = file.stat().st_size
    if actual != expected:
        raise DataError(f"{file} is corrupt: {actual} bytes, expected {expected} "
                        f"for {count} tokens")
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(file, dtype=dtype, mode="r", shape=(count,))


class DatasetWriter:
    """Streams samples to disk; `close()` writes offsets and meta.json last, so a data set
    with meta.json is always complete."""

    def __init__(self, path: str | Path, vocab_size: int, extra_meta: dict | None = None):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "meta.json").unlink(missing_ok=True)
        self.vocab_size = int(vocab_size)
        self.extra = dict(extra_meta or {})
        self._tok = open(self.path / "tokens.bin", "wb")
        self._mask = open(self.path / "loss_mask.bin", "wb")
        self._offsets = [0]
        self._max_id = -1

    def add(self, tokens, loss_mask) -> None:
        t = np.asarray(tokens)
        m = np.asarray(loss_mask)
        if t.ndim != 1 or t.shape != m.shape or len(t) == 0:
            raise DataError(f"sample {len(self._offsets) - 1}: tokens and loss mask must be "
                            f"equal-length non-empty 1-D arrays, got {t.shape} and {m.shape}")
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= self.vocab_size:
            raise DataError(f"sample {len(self._offsets) - 1}: token id {hi if hi >= self.vocab_size else lo} "
                            f"outside the vocabulary [0, {self.vocab_size})")
        self._max_id = max(self._max_id, hi)
        self._tok.write(t.astype(TOKEN_DTYPE).tobytes())
        self._mask.write(m.astype(np.uint8).tobytes())
        self._offsets.append(self._offsets[-1] + len(t))

    def __len__(self) -> int:  # samples added so far
        return len(self._offsets) - 1

    def close(self) -> TokenDataset:
        self._tok.close()
        self._mask.close()
        if len(self._offsets) == 1:
            raise DataError(f"{self.path}: no samples were written")
        np.save(self.path / "offsets.npy", np.asarray(self._offsets, dtype=np.int64))
        meta = {"format": FORMAT, "version": VERSION, "num_samples": len(self._offsets) - 1,
                "num_tokens": self._offsets[-1], "vocab_size": self.vocab_size,
                "max_token_id": self._max_id, **self.extra}
        (self.path / "meta.json").write_text(json.dumps(meta, indent=2))
        return TokenDataset.open(self.path)
