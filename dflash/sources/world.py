"""The default CPU world: a tiny target worth drafting for, and data it would write.

Each sample is [USER, filler.., ASSISTANT, motif, reply..]. The motif has `period` slots;
slot i holds a token drawn per sample from its own range of `slot_size` ids, and the
reply walks the slots in order, again and again. So the next reply token is fixed by the
prompt, not by the last few tokens: an n-gram table built from the training data knows
only which slot comes next (1 in `slot_size`), and a drafter can only do better by
reading the target's hidden states, which carry the prompt. That is the question a
DFlash world must pose: does the drafter learn to use its target context?

The tiny target (`model=tiny`) is fitted to the rule once, then the training replies are
made target-consistent, as DFlash data is made: a reply token the fitted target would
not write greedily is replaced by the one it would (and the check repeats on the new
prefix); where that does not settle in a few rounds, the rest of the reply is left
unsupervised. The fitted target (an HF directory) and the data set are cached under
`data.cache_dir`, keyed by every setting that shapes them, so later runs start at once.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock
from tqdm.auto import tqdm

from dflash.errors import DataError
from dflash.schedule import warmup_cosine
from dflash.data.format import DatasetWriter, TokenDataset
from dflash.data.synthetic import ASSISTANT_ID, FIRST_CONTENT_ID, USER_ID

log = logging.getLogger("dflash.world")
VERSION = 2  # 2: fit without the padding mask
PROMPT_FRACTION = 0.3  # filler + motif take about this share of a sample


@dataclass(frozen=True)
class World:
    vocab_size: int
    period: int = 8
    slot_size: int = 8

    def __post_init__(self):
        if self.period < 2 or self.slot_size < 2:
            raise DataError(f"data.period and data.slot_size must be >= 2, got {self.period}, "
                            f"{self.slot_size}")
        if self.filler_range[1] - self.filler_range[0] < 8:
            raise DataError(f"data.vocab_size={self.vocab_size} is too small for {self.period} "
                            f"slots of {self.slot_size} tokens")

    @property
    def filler_range(self) -> tuple[int, int]:
        # slots first, then filler; the top id stays free for the drafter's mask token
        return FIRST_CONTENT_ID + self.period * self.slot_size, self.vocab_size - 1

    def min_length(self) -> int:
        return self.period + 4  # USER, ASSISTANT, a motif and at least two reply tokens

    def prompt_length(self, length: int) -> int:
        filler = max(0, int(round(PROMPT_FRACTION * length)) - self.period - 2)
        return 2 + filler + self.period

    def sample(self, length: int, rng: np.random.Generator):
        """tokens [length] int64, loss mask [length] bool, prompt length."""
        if length < self.min_length():
            raise DataError(f"world samples need >= {self.min_length()} tokens "
                            f"(data.period={self.period}), got {length}")
        p = self.prompt_length(length)
        toks = rng.integers(*self.filler_range, size=length)
        toks[0] = USER_ID
        toks[p - self.period - 1] = ASSISTANT_ID
        motif = (FIRST_CONTENT_ID + np.arange(self.period) * self.slot_size
                 + rng.integers(0, self.slot_size, size=self.period))
        toks[p - self.period:p] = motif
        toks[p:] = motif[np.arange(length - p) % self.period]
        mask = np.zeros(length, dtype=bool)
        mask[p:] = True
        return toks, mask, p

    def batch(self, lengths, rng):
        """Right-padded rows for samples of the given lengths (pad id 0)."""
        width = int(max(lengths))
        ids = np.zeros((len(lengths), width), dtype=np.int64)
        mask = np.zeros((len(lengths), width), dtype=bool)
        prompt = np.zeros(len(lengths), dtype=np.int64)
        for r, n in enumerate(lengths):
            t, m, p = self.sample(int(n), rng)
            ids[r, :n], mask[r, :n], prompt[r] = t, m, p
        return ids, mask, prompt


def _key(payload: dict) -> str:
    return hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _target_settings(target_cfg) -> dict:
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size", "seed")
    return {k: int(target_cfg[k]) for k in keys}


def fit_target(world: World, target_cfg, steps: int, cache_dir: str | Path,
               batch: int = 32, lr: float = 1e-2, progress: bool = True) -> Path:
    """Fit the tiny target to the world's rule (cached); returns its HF directory."""
    if target_cfg.path is not None:
        raise DataError("data=world fits its own tiny target: use model=tiny "
                        f"(model.target.path={target_cfg.path} is set)")
    if int(target_cfg.vocab_size) != world.vocab_size:
        raise DataError(f"data.vocab_size={world.vocab_size} differs from "
                        f"model.target.vocab_size={target_cfg.vocab_size}")
    settings = {"target": _target_settings(target_cfg), "period": world.period,
                "slot_size": world.slot_size, "steps": steps, "batch": batch, "lr": lr, "v": VERSION}
    path = Path(cache_dir) / f"world-target-{_key(settings)}"
    _once(path / "config.json", lambda: _fit(world, target_cfg, steps, path, settings, batch,
                                             lr, progress))
    return path


def _once(marker: Path, build) -> None:
    """Build a cache entry unless its marker file exists. Ranks (or test workers)
    sharing a cold cache: one builds under the lock, the others wait and read it."""
    if marker.exists():
        return
    marker.parent.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(marker.parent) + ".lock"):
        if not marker.exists():
            build()


def _fit(world: World, target_cfg, steps: int, path: Path, settings: dict, batch: int,
         lr: float, progress: bool) -> None:
    from dflash.model.target import build_tiny_qwen3

    t0 = time.time()
    lm = build_tiny_qwen3(target_cfg).train()
    opt = torch.optim.AdamW(lm.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: warmup_cosine(s, steps, 0.0, warmup_steps=30, decay_during_warmup=True))
    rng = np.random.default_rng(np.random.SeedSequence([int(target_cfg.seed), 505]))
    bar = tqdm(range(steps), desc="fit world target", disable=not progress, mininterval=2.0)
    for step in bar:
        # alternate short and long rows so the copy rule holds at every position
        width = 96 if step % 2 == 0 else 384
        n = batch if width == 96 else batch // 4
        lens = rng.integers(max(world.min_length(), width // 2), width + 1, size=n)
        ids, mask, _ = world.batch(lens, rng)
        x = torch.from_numpy(ids)
        labels = torch.where(torch.from_numpy(mask), x, torch.full_like(x, -100))
        # rows are right-padded and pads carry no label: the causal mask alone keeps
        # real tokens off the pads, and without a 2-D mask sdpa takes its causal
        # kernel (a third faster a step than a materialised padding mask)
        loss = lm(input_ids=x, labels=labels, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    lm.eval().save_pretrained(tmp)
    (tmp / "world_fit.json").write_text(json.dumps({**settings, "final_loss": float(loss.item()),
                                                     "seconds": time.time() - t0}, indent=2))
    tmp.rename(path)
    log.info("fitted the world target in %.0f s (final loss %.3f): %s", time.time() - t0,
             loss.item(), path)


@torch.no_grad()
def make_target_consistent(lm, ids: np.ndarray, mask: np.ndarray, lengths: np.ndarray,
                           rounds: int = 8) -> dict:
    """Make replies (in place) what the target writes greedily; returns counts."""
    x = torch.from_numpy(ids)
    att = torch.from_numpy(np.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    sup = torch.from_numpy(mask)
    fixed = torch.zeros(len(ids), dtype=torch.bool)

    def misses():
        """(supervised positions the target would write otherwise, its predictions)."""
        pred = lm(input_ids=x, attention_mask=att, use_cache=False).logits.argmax(-1)
        wrong = torch.zeros_like(sup)
        wrong[:, 1:] = sup[:, 1:] & (pred[:, :-1] != x[:, 1:])
        return wrong, pred

    for _ in range(rounds):
        wrong, pred = misses()
        rows = wrong.any(1)
        if not rows.any():
            break
        first = wrong.float().argmax(1)
        r = rows.nonzero().squeeze(1)
        x[r, first[r]] = pred[r, first[r] - 1]  # the target's own token at its first miss
        fixed |= rows
    else:
        wrong, _ = misses()
    # still unsettled: supervise only the prefix the target agrees with
    unsettled = wrong.any(1)
    cut = torch.where(unsettled, wrong.float().argmax(1).long(),
                      torch.full((len(ids),), ids.shape[1], dtype=torch.long))
    sup &= torch.arange(ids.shape[1])[None, :] < cut[:, None]
    ids[:] = x.numpy()
    mask[:] = sup.numpy()
    return {"rewritten": int(fixed.sum()), "unsettled": int(unsettled.sum())}


def build_world_data(world: World, target_dir: Path, lengths: np.ndarray, seed: int,
                     cache_dir: str | Path, progress: bool = True, chunk: int = 64) -> TokenDataset:
    """The training data set for these lengths, target-consistent (cached)."""
    settings = {"target": target_dir.name, "period": world.period, "slot_size": world.slot_size,
                "seed": seed, "n": len(lengths), "sum": int(lengths.sum()),
                "max": int(lengths.max()), "v": VERSION}
    path = Path(cache_dir) / f"world-data-{_key(settings)}"
    _once(path / "meta.json", lambda: _write_world_data(world, target_dir, lengths, seed, path,
                                                        settings, progress, chunk))
    return TokenDataset.open(path)


def _write_world_data(world: World, target_dir: Path, lengths: np.ndarray, seed: int, path: Path,
                      settings: dict, progress: bool, chunk: int) -> None:
    from transformers import AutoModelForCausalLM

    short = np.flatnonzero(lengths < world.min_length())
    if len(short):
        raise DataError(f"world data: sample {int(short[0])} has {int(lengths[short[0]])} tokens, "
                        f"below the {world.min_length()} a world sample needs: raise "
                        "data.min_length")
    lm = AutoModelForCausalLM.from_pretrained(str(target_dir), local_files_only=True).eval()
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 606]))
    order = np.argsort(lengths, kind="stable")  # similar lengths per forward: less padding
    rows, counts = {}, {"rewritten": 0, "unsettled": 0}
    for s in tqdm(range(0, len(order), chunk), desc="world data", disable=not progress):
        sel = order[s:s + chunk]
        ids, mask, _ = world.batch(lengths[sel], rng)
        for k, v in make_target_consistent(lm, ids, mask, lengths[sel]).items():
            counts[k] += v
        for r, i in enumerate(sel):
            rows[int(i)] = (ids[r, :lengths[i]], mask[r, :lengths[i]])
    shutil.rmtree(path.with_name(path.name + ".tmp"), ignore_errors=True)
    writer = DatasetWriter(path.with_name(path.name + ".tmp"), world.vocab_size,
                           {"source": "world", **settings,
                            "target_rewritten_samples": counts["rewritten"],
                            "target_unsettled_samples": counts["unsettled"]})
    for i in range(len(lengths)):
        writer.add(*rows[i])
    writer.close()
    path.with_name(path.name + ".tmp").rename(path)
    log.info("world data: %d samples, %d rewritten to the target's greedy choice, %d with "
             "an unsupervised tail", len(lengths), counts["rewritten"], counts["unsettled"])


def held_out_prompts(world: World, lengths: np.ndarray, seed: int) -> list[np.ndarray]:
    """Prompts (up to and including the motif) from a seed stream training never uses."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 707]))
    out = []
    for n in lengths:
        t, _, p = world.sample(max(int(n), world.min_length()), rng)
        out.append(t[:p])
    return out


@dataclass
class WorldData:
    dataset: TokenDataset
    target_dir: Path
    world: World


def load_world(data_cfg, target_cfg, lengths: np.ndarray, progress: bool = True) -> WorldData:
    """Fit (or reuse) the world's target, then build (or reuse) its training data."""
    world = World(int(data_cfg.vocab_size), int(data_cfg.period), int(data_cfg.slot_size))
    target_dir = fit_target(world, target_cfg, int(data_cfg.target_fit_steps),
                            data_cfg.cache_dir, batch=int(data_cfg.target_fit_batch),
                            progress=progress)
    ds = build_world_data(world, target_dir, lengths, int(data_cfg.seed), data_cfg.cache_dir,
                          progress=progress)
    return WorldData(ds, target_dir, world)
