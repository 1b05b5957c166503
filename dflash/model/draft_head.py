"""A smaller draft head: the drafter's LM head cut to a draft vocabulary, exported so that
drafting does not pay the target's whole LM head (49K-152K rows) every block.

A run trained with `loss.draft_vocab=N` writes, beside `drafter/`, `drafter_draft_vocab/`:
the same drafter plus

    lm_head.weight  [N, H]  the target's LM head rows of the N kept ids (ascending)
    d2t             [N]     int64 offsets target_id - i (the EAGLE-3 / speculators
                            convention; llama.cpp writes them to GGUF as absolute ids)

and `draft_vocab_size: N` in its config. Its architectures name `DSparkDraftModel`
first: llama.cpp's DFlash converter (`DFlashDraftModel`) maps no `d2t`, its DSpark
converter does, and with no Markov tensors the GGUF is a plain DFlash drafter whose
runtime (`--spec-type draft-dflash`) scores the N rows and scatters them to the target's
ids (`-inf` elsewhere). `sample_from_anchor: false` says slot 0 is the anchor (only a
DSpark runtime reads it; the drafter's own layout is kept). A DSpark drafter's W2 keeps
the same rows. dflash drafts over it the same way (`DraftHead.logits`).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dflash.errors import DataError


class DraftHead:
    """Logits over the kept rows only, scattered to the full vocabulary (-inf elsewhere):
    a greedy draft can only be a kept id, as in llama.cpp's runtime."""

    def __init__(self, ids: torch.Tensor, weight: torch.Tensor, vocab_size: int):
        self.ids, self.weight, self.vocab_size = ids.long(), weight, int(vocab_size)

    def to(self, device) -> "DraftHead":
        return DraftHead(self.ids.to(device), self.weight.to(device), self.vocab_size)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        kept = (h.to(self.weight.dtype) @ self.weight.t()).float()
        full = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.ids] = kept
        return full


def save_draft_head(drafter_dir: Path, out: Path, ids, lm_head_weight: torch.Tensor) -> Path:
    """`drafter_dir`'s export plus the head over `ids` (the target's rows), in `out`."""
    ids = torch.as_tensor(sorted(int(i) for i in ids), dtype=torch.int64)
    if len(ids) != len(torch.unique(ids)):
        raise DataError(f"{out}: the draft vocabulary repeats a token id")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((Path(drafter_dir) / "config.json").read_text())
    state = load_file(str(Path(drafter_dir) / "model.safetensors"))
    dtype = next(iter(state.values())).dtype
    state["lm_head.weight"] = lm_head_weight.detach()[ids].to(dtype).contiguous().cpu()
    state["d2t"] = ids - torch.arange(len(ids), dtype=torch.int64)
    w2 = state.get("markov_head.markov_w2.weight")
    if w2 is not None:  # a Markov head (or the placeholder): W2 keeps the same rows
        state["markov_head.markov_w2.weight"] = w2[ids].contiguous()
    cfg.update(architectures=["DSparkDraftModel", "DFlashDraftModel"],
               draft_vocab_size=len(ids), sample_from_anchor=bool(cfg.get("sample_from_anchor", False)))
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for extra in Path(drafter_dir).iterdir():  # anything else the export carries
        if extra.name not in ("config.json", "model.safetensors"):
            shutil.copy2(extra, out / extra.name)
    return out


def pop_draft_head(cfg: dict, state: dict, where: str) -> DraftHead | None:
    """The draft head an export carries (removed from `state`), or None."""
    n = cfg.get("draft_vocab_size")
    if n is None or int(n) >= int(cfg["vocab_size"]):
        state.pop("lm_head.weight", None)
        state.pop("d2t", None)
        return None
    if "d2t" not in state or "lm_head.weight" not in state:
        raise DataError(f"{where}: draft_vocab_size {n} < vocab_size {cfg['vocab_size']} but "
                        "no d2t / lm_head.weight tensors")
    d2t, weight = state.pop("d2t"), state.pop("lm_head.weight")
    ids = d2t.long() + torch.arange(len(d2t), dtype=torch.int64, device=d2t.device)
    if len(ids) != int(n) or tuple(weight.shape) != (int(n), int(cfg["hidden_size"])):
        raise DataError(f"{where}: d2t has {len(ids)} rows and lm_head.weight "
                        f"{tuple(weight.shape)} for draft_vocab_size {n}")
    if int(ids.min()) < 0 or int(ids.max()) >= int(cfg["vocab_size"]):
        raise DataError(f"{where}: d2t points outside the vocabulary of {cfg['vocab_size']}")
    return DraftHead(ids, weight, int(cfg["vocab_size"]))


def parser():
    import argparse
    ap = argparse.ArgumentParser(prog="python -m dflash.model.draft_head",
                                 description=main.__doc__.splitlines()[0])
    for name in ("--drafter", "--data", "--target", "--out"):
        ap.add_argument(name, required=True, type=Path)
    ap.add_argument("--size", required=True, type=int)
    return ap


def main(argv=None) -> None:
    """`python -m dflash.model.draft_head --drafter DIR --data DATA --size N --target DIR
    --out DIR`: the draft-vocabulary export of a drafter trained before (or at another
    size): the N ids the data set supervises most (ties: lower id), the target's LM head
    rows for them."""
    import numpy as np

    from dflash.data.format import TokenDataset
    from dflash.errors import user_errors_exit
    from dflash.model.draft_vocab import DraftVocab

    a = parser().parse_args(argv)

    @user_errors_exit
    def run():
        from dflash.model.checkpoint import drafter_config
        from dflash.model.target import load_causal_lm
        drafter_config(a.drafter)  # the drafter and data read before the target loads
        data = TokenDataset.open(a.data).supervised_counts()
        lm = load_causal_lm(a.target, torch.float32, key="--target")
        head = lm.get_output_embeddings().weight
        counts = np.zeros(head.shape[0], dtype=np.int64)
        counts[:len(data)] = data[:len(counts)]
        vocab = DraftVocab.most_frequent(counts, a.size)
        out = save_draft_head(a.drafter, a.out, vocab.ids.tolist(), head)
        print(f"{out}: {len(vocab.ids)} of {head.shape[0]} ids, {100 * vocab.coverage:.2f}% of "
              f"the supervised tokens of {a.data}")
    run()


if __name__ == "__main__":
    main()
