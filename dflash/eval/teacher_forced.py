"""Teacher-forced acceptance on given continuations, and where decoding loses it.

Training reports a teacher-forced estimate (1 + the mean run of leading correct drafts
per block, blocks anchored uniformly) on its own batches; decoding measures real
acceptance on held-out prompts. The two differ for three reasons, and measuring the
estimate on the held-out prompts followed by the continuation greedy decoding produced
(the target's own tokens) separates them:

    train estimate  vs  held-out, every position   overfitting, or eval prompts unlike
                                                   the training data
    held-out every position  vs  decode path       where decoding anchors: it spends
                                                   more steps where drafting is hard (a
                                                   mean over steps, not over positions)
    held-out decode path  vs  decoded              the same blocks, the same tokens: any
                                                   gap is a train/serve mismatch (taps,
                                                   mask token, positions, dtype)

The decode path walks the continuation as greedy decoding does: the prefill gives the
first reply token, the first block is anchored at it, each step emits its anchor and its
run of correct drafts, and the next block is anchored at the token after them. Per position k the figures are the share of blocks (or verify steps)
with at least k drafts accepted.
"""
from __future__ import annotations

import numpy as np
import torch

from dflash.decode.steps import emit, walk
from dflash.kernels import fused_lm_head_ce
from dflash.model.dspark import first_slot, num_drafts
from dflash.model.loss import block_embeddings, block_targets, tokens_before

# a decode-path estimate this much above the decoded figure (relative) is a mismatch
GAP_WARNING = 0.10


@torch.no_grad()
def continuation_streaks(target, drafter, sequences, prompt_lengths, batch_size: int = 8) -> list:
    """Per sequence: for every anchor a from its first continuation token (the first a
    decoding anchors at, the first training would: the prompt is unsupervised) to its
    second-to-last token, the run of leading correct drafts of the block at a."""
    out = []
    for rows, firsts, hidden, targets, tsup, prev in _blocks(target, drafter, sequences,
                                                            prompt_lengths, batch_size):
        streak = leading_correct(hidden, target.lm_head_weight, targets, tsup,
                                 drafter.markov_head, prev).cpu().numpy()
        for i, (r, f) in enumerate(zip(rows, firsts)):
            out.append(streak[i, :max(0, len(r) - 1 - f)].astype(np.int64))
    return out


@torch.no_grad()
def path_steps(target, drafter, sequences, prompt_lengths, batch_size: int = 8) -> list:
    """Per sequence, `decode_path` of its streaks, scoring only the blocks the path
    anchors at (~1 in 1.6 where drafts are accepted ~1.6 at a time): the rows of a
    batch walk their paths in lockstep, one block each per round."""
    out = []
    for rows, firsts, hidden, targets, tsup, prev in _blocks(target, drafter, sequences,
                                                            prompt_lengths, batch_size):
        n = torch.tensor([len(r) - f for r, f in zip(rows, firsts)], device=hidden.device)
        at = torch.zeros_like(n)  # each row's anchor, as an index into its continuation
        steps = [[] for _ in rows]
        while bool((at < n).any()):
            live = (at < n - 1).nonzero(as_tuple=True)[0]  # a block left to draft
            take = torch.ones_like(n)
            if len(live):
                a = at[live]
                streak = leading_correct(hidden[live, a][:, None], target.lm_head_weight,
                                         targets[live, a][:, None], tsup[live, a][:, None],
                                         drafter.markov_head, prev[live, a][:, None])[:, 0]
                take[live] = emit(streak, n[live] - a)
            for i in (at < n).nonzero(as_tuple=True)[0].tolist():
                steps[i].append(int(take[i]))
            at = torch.where(at < n, at + take, at)
        out += steps
    return out


def _blocks(target, drafter, sequences, prompt_lengths, batch_size: int):
    """Per batch of sequences: (rows, first continuation indices, the drafter's hidden
    states [B, A, n, H] at the drafting slots of the blocks anchored at every
    continuation token but the last, their target tokens and supervision [B, A, n], and
    the token before each target [B, A, n]: under greedy chaining a slot whose earlier
    drafts were all right conditions on exactly these)."""
    dev = target.lm_head_weight.device
    bs, first = drafter.spec.block_size, first_slot(drafter.spec)
    was_training = drafter.training
    drafter.eval()
    try:
        for start in range(0, len(sequences), batch_size):
            rows = [np.asarray(r, dtype=np.int64) for r in sequences[start:start + batch_size]]
            firsts = [int(p) for p in prompt_lengths[start:start + batch_size]]
            width = max(len(r) for r in rows)
            n_anchor = max(1, max(len(r) - 1 - f for r, f in zip(rows, firsts)))
            ids = torch.zeros(len(rows), width, dtype=torch.long, device=dev)
            valid = torch.zeros(len(rows), width, dtype=torch.bool, device=dev)
            sup = torch.zeros_like(valid)
            anchors = torch.zeros(len(rows), n_anchor, dtype=torch.long, device=dev)
            ok = torch.zeros(len(rows), n_anchor, dtype=torch.bool, device=dev)
            for i, (r, f) in enumerate(zip(rows, firsts)):
                ids[i, :len(r)] = torch.as_tensor(r, device=dev)
                valid[i, :len(r)] = True
                sup[i, f:len(r)] = True  # drafts are scored on the continuation only
                k = max(0, len(r) - 1 - f)
                anchors[i, :k] = torch.arange(f, f + k, device=dev)
                ok[i, :k] = True
            ctx = target.context(ids, attention_mask=valid.long())
            emb = block_embeddings(target.embed_tokens, ids, anchors, bs, drafter.spec.mask_token_id)
            hidden = drafter(ctx, valid, anchors, ok, emb)[:, :, first:]
            n = bs - first
            targets, tsup = block_targets(ids, sup, valid, anchors, ok, n + 1)
            yield rows, firsts, hidden, targets, tsup, tokens_before(ids, anchors, n)
    finally:
        drafter.train(was_training)


def leading_correct(hidden, head, targets, sup, markov=None, prev=None) -> torch.Tensor:
    """[B, A] run of leading drafts equal to `targets` per block (hidden [B, A, n, H]).
    Position k is scored only for blocks whose drafts before it were all right: the
    full-vocabulary LM head, most of the cost, runs on ~1.6 positions a block instead
    of n where drafts are accepted ~1.6 at a time. `markov` (a DSpark drafter's head)
    biases each slot by its previous token `prev` [B, A, n]."""
    alive = sup[:, :, 0].clone()
    streak = torch.zeros(alive.shape, dtype=torch.long, device=hidden.device)
    for k in range(hidden.shape[2]):
        alive &= sup[:, :, k]
        where = alive.nonzero(as_tuple=True)
        if not len(where[0]):
            break
        h = hidden[where][:, k].to(head.dtype)
        if markov is None:
            _, _, pred = fused_lm_head_ce(h, head, targets[where][:, k],
                                          torch.ones(len(where[0]), device=hidden.device))
        else:
            bias = markov.full(prev[where][:, k], head.shape[0])
            pred = ((h @ head.t()).float() + bias.float()).argmax(-1)
        hit = pred == targets[where][:, k]
        alive[where] = hit
        streak[where] += hit.long()
    return streak


def decode_path(streaks: np.ndarray) -> list:
    """Tokens emitted per verify step when greedy decoding walks this continuation
    (len(streaks) + 1 tokens): from its first token, each step emits its anchor and the
    anchor's streak of drafts (the last token has no block to draft)."""
    return walk(len(streaks) + 1, lambda a: int(streaks[a]) if a < len(streaks) else 0)


def _at_least(accepted: np.ndarray, block_size: int) -> list:
    """Share with at least k drafts accepted, k = 1..bs-1 (accepted counts 1 + drafts)."""
    if len(accepted) == 0:
        return [0.0] * (block_size - 1)
    return [float((accepted >= k + 1).mean()) for k in range(1, block_size)]


def teacher_forced_acceptance(target, drafter, sequences, prompt_lengths,
                              batch_size: int = 8) -> dict:
    """The estimate at every position of the continuations, and along the decode path."""
    streaks = continuation_streaks(target, drafter, sequences, prompt_lengths, batch_size)
    bs = num_drafts(drafter.spec) + 1
    every = 1 + np.concatenate(streaks) if streaks else np.zeros(0, dtype=np.int64)
    path = np.asarray([s for row, seq, p in zip(streaks, sequences, prompt_lengths)
                       if len(seq) > int(p) for s in decode_path(row)], dtype=np.int64)
    return {"acceptance_length": float(every.mean()) if len(every) else 0.0,
            "per_position": _at_least(every, bs), "blocks": int(len(every)),
            "decode_path_acceptance_length": float(path.mean()) if len(path) else 0.0,
            "decode_path_per_position": _at_least(path, bs), "decode_path_steps": int(len(path))}


def decoded_per_position(histogram) -> list:
    """From a decode histogram (verify steps accepting k = 1..bs tokens): the share of
    steps that accepted at least k drafts, k = 1..bs-1."""
    h = np.asarray(histogram, dtype=np.float64)
    if h.sum() == 0:
        return [0.0] * max(0, len(h) - 1)
    tail = np.cumsum(h[::-1])[::-1] / h.sum()  # tail[j]: steps with >= j+1 tokens
    return [float(x) for x in tail[1:]]


def acceptance_gap(train_estimate, heldout: dict, decoded: dict, temperature: float) -> dict:
    """The figures side by side, and a warning where the decode-path estimate and the
    decoded acceptance disagree on the same blocks (greedy only: sampling accepts by
    another rule and decodes other tokens)."""
    path, dec = heldout.get("decode_path_acceptance_length"), decoded.get("acceptance_length")
    out = {"train_teacher_forced": train_estimate,
           "heldout_teacher_forced": heldout.get("acceptance_length"),
           "heldout_decode_path": path, "heldout_decoded": dec,
           "heldout_teacher_forced_per_position": heldout.get("per_position"),
           "heldout_decode_path_per_position": heldout.get("decode_path_per_position"),
           "heldout_decoded_per_position": decoded_per_position(decoded.get("histogram") or []),
           "warning": None}
    if temperature <= 0 and path and dec and path > dec * (1 + GAP_WARNING):
        out["warning"] = (
            f"teacher-forced acceptance along the decode path {path:.2f} but decoded {dec:.2f} "
            "on the same prompts and tokens: a train/serve mismatch. Check the target layers "
            "the drafter taps (and that none is the last), the mask token id, the block size, "
            "position ids after the prompt, and the dtype the drafter is served in")
    return out


GAP_COLUMNS = [("train_teacher_forced", "train (tf)"),
               ("heldout_teacher_forced", "held-out (tf)"),
               ("heldout_decode_path", "decode path (tf)"),
               ("heldout_decoded", "decoded")]


def format_gap(gap: dict) -> str:
    """The console table: the figures, then per-position acceptance on held-out prompts."""
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    lines = ["acceptance length   " + "  ".join(f"{name:>16}" for _, name in GAP_COLUMNS),
             " " * 20 + "  ".join(f"{fmt(gap.get(k)):>16}" for k, _ in GAP_COLUMNS)]
    rows = [("held-out (tf)", gap.get("heldout_teacher_forced_per_position") or []),
            ("decode path (tf)", gap.get("heldout_decode_path_per_position") or []),
            ("decoded", gap.get("heldout_decoded_per_position") or [])]
    width = max(len(r) for _, r in rows)
    if width:
        lines.append("P(>= k drafts)    k: " + " ".join(f"{k:>5}" for k in range(1, width + 1)))
        lines += [f"  {name:<19}" + " ".join(f"{x:5.2f}" for x in r) for name, r in rows]
    if gap.get("warning"):
        lines.append("WARNING: " + gap["warning"])
    return "\n".join(lines)
