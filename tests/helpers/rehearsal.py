"""Every family through the whole path a user takes: the target's greedy replies
(regenerate) -> token data with its real chat template (prepare) -> training on 2 gloo
ranks with the target split over both (`topology.target_tp=2`) -> speculative decoding
of held-out prompts (eval, lossless against HF's greedy generate) -> the exported drafter
read by the public reference reader with an equal forward. `rehearse` gives one row a
family; `table` the markdown of docs/tested-models.md (benchmarks/tested_models.py
writes it, tests/integration/test_family_rehearsal.py checks it against a new run)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from tests.helpers.families import FAMILIES, TEMPLATES, build_target

SUBJECTS = ["rivers", "prime numbers", "bread", "volcanoes", "chess", "tides", "owls",
            "glass", "maps", "rain", "copper", "bees", "clocks", "salt"]
SYSTEM = "You answer in one short sentence."
NO_SYSTEM = {"gemma3"}  # its template raises on a system turn (checked: refused in one line)
STEPS = 6
DRAFT_VOCAB = 128  # the training softmax, and the draft head exported beside the drafter


def prompts(name: str, n: int, start: int = 0) -> list:
    out = []
    for i in range(start, start + n):
        msgs = [{"role": "user", "content": f"Tell me about {SUBJECTS[i % len(SUBJECTS)]}."}]
        if i % 2 and name not in NO_SYSTEM:  # half the prompts carry a system turn
            msgs.insert(0, {"role": "system", "content": SYSTEM})
        out.append({"id": i, "messages": msgs})
    return out


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prepare_family(name: str, root: Path) -> dict:
    """The family's target, its replies and token data under root/name (one process)."""
    from dflash.data.prepare import prepare
    from tests.helpers.run import run_module
    d = root / name
    model = build_target(name, d / "model")
    train = _jsonl(d / "prompts.jsonl", prompts(name, 12))
    _jsonl(d / "heldout.jsonl", prompts(name, 2, start=12))
    run_module("dflash.regenerate", f"inputs=[{train}]", f"out={d / 'replies.jsonl'}",
               "model=hf", f"model.target.path={model}", "max_new_tokens=24", "progress=false",
               f"hydra.run.dir={d / 'regenerate'}")
    replies = [json.loads(x) for x in (d / "replies.jsonl").read_text().splitlines()]
    ds, _ = prepare(d / "replies.jsonl", model, d / "data")
    supervised = sum(int(ds.sample(k)[1].sum()) for k in range(len(ds)))
    return {"family": name, "replies": len(replies), "supervised": supervised}


def train_rank(rank: int, world: int, port: int, root: str, names: list, result: str) -> None:
    """One of 2 gloo ranks: every family's drafter trained with its target split 2 ways."""
    from dflash.config import compose
    from dflash.topology import shutdown_process_group
    from dflash.trainer import Trainer
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    out = {}
    try:
        for name in names:
            d = Path(root) / name
            cfg = compose("train", [
                "model=hf", f"model.target.path={d / 'model'}", "data=tokenized",
                f"data.path={d / 'data'}", "data.max_seq_len=512",
                "topology=pairs", "topology.device=cpu", "topology.target_tp=2",
                f"optim.max_steps={STEPS}", "eval.enabled=false", "logger.progress=false",
                f"loss.draft_vocab={DRAFT_VOCAB}",
                "warmup=none", "logger.log_every=1"])
            tr = Trainer(cfg, d / "train").build()
            s = tr.run()
            out[name] = {"steps": s["steps"], "initial_loss": s["initial_loss"],
                         "final_loss": s["final_loss"], "target": type(tr.target).__name__,
                         "taps": list(tr.drafter.spec.target_layer_ids),
                         "mask": int(tr.drafter.spec.mask_token_id)}
        if rank == 0:
            torch.save(out, result)
        torch.distributed.barrier()
    finally:
        shutdown_process_group()


def check_family(name: str, root: Path, trained: dict) -> dict:
    """Eval (lossless against HF greedy) and the reference reader on the export."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash.model.checkpoint import load_drafter
    from tests.helpers.reference import reference_drafter, same_blocks
    from tests.helpers.run import run_module
    d = root / name
    drafter = d / "train" / "drafter"
    run_module("dflash.eval", f"drafter={drafter}", "model=hf", f"model.target.path={d / 'model'}",
               f"prompts={d / 'heldout.jsonl'}", "format=chat", "max_new_tokens=16",
               f"out={d / 'eval.json'}", f"hydra.run.dir={d / 'eval'}")
    ev = json.loads((d / "eval.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(d / "model"))
    lm = AutoModelForCausalLM.from_pretrained(str(d / "model")).eval()
    heldout = [json.loads(x) for x in (d / "heldout.jsonl").read_text().splitlines()]
    text = tok.apply_chat_template(heldout[0]["messages"], tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    want = lm.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id,
                       eos_token_id=tok.eos_token_id)[0, ids.shape[1]:].tolist()
    got = ev["tokens"][0]
    lossless = got == want[:len(got)] and len(got) >= min(len(want), 1)
    diff = same_blocks(load_drafter(drafter), reference_drafter(drafter))
    head = load_drafter(d / "train" / "drafter_draft_vocab").draft_head
    t = trained[name]
    sys_turn = "kept" if name not in NO_SYSTEM else "refused by the template"
    return {**t, "family": name, "class": FAMILIES[name][0].replace("Config", ""),
            "template": FAMILIES[name][2].replace(".jinja", ""), "system": sys_turn,
            "acceptance": ev["acceptance_length"], "lossless": lossless, "reader_diff": diff,
            "draft_head_rows": None if head is None else len(head.ids)}


def table(rows: list) -> str:
    """The tested-models table: only what does not vary from machine to machine."""
    head = ("| family | config class | chat template (published) | system turn | TP | taps "
            "(of 8) | mask id | regenerate -> prepare | train, 2 ranks | eval | reference reader |")
    lines = [head, "|" + " --- |" * 11]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['class']} | {r['template']} | {r['system']} | "
            f"{2 if r['target'] == 'TensorParallelTarget' else 1} | {r['taps']} | {r['mask']} | "
            f"{r['replies']} replies, assistant turns supervised | {r['steps']} steps, "
            f"loss fell | lossless | forward equal |")
    return "\n".join(lines)


__all__ = ["FAMILIES", "TEMPLATES", "prepare_family", "train_rank", "check_family", "table"]
