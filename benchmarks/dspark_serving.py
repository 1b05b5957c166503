"""A DSpark drafter trained by dflash, served by llama.cpp: tokens and acceptance equal.

    make llama-cpp && .venv/bin/python benchmarks/dspark_serving.py [--steps 300] [--work DIR]

On a tiny *untied* Llama target (SmolLM2's tokenizer, 49,152 ids; its own LM head, not
its embeddings): the target's greedy replies to random prompts as training data, a
DSpark drafter (Markov rank 32, confidence head) trained in both block layouts, each
decoded by dflash's eval and by `llama-server --spec-type draft-dspark` (its converter
and runtime), with and without the confidence stop. Per row: prompts whose tokens are
equal, both engines' acceptance and whether the accepted drafts agree prompt by prompt;
then the GGUF metadata llama.cpp wrote. Last, the two hazards of docs/serving.md made on
purpose (an export carrying the target's embeddings; an anchor-first drafter without a
Markov head served as plain DFlash), to show what dflash's export guards against.
Stopped and run again, it continues: the target, data and finished trainings are reused,
a killed training resumes from its checkpoint, conversions are reused.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_target(out: Path) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from dflash.recipe.gguf import smollm2_dir
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir(ROOT / ".cache" / "dflash")))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    lm = LlamaForCausalLM(cfg)
    with torch.no_grad():  # a sharper LM head over 2,000 ids (as a trained model's replies
        lm.lm_head.weight.mul_(8.0)  # use a small part of its vocabulary): replies a small
        lm.lm_head.weight[:300] *= 1e-3  # drafter learns in minutes, a draft vocabulary
        lm.lm_head.weight[2300:] *= 1e-3  # covers
    lm.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build_data(target_dir: Path, work: Path, n_train: int, n_eval: int) -> tuple[Path, Path]:
    """Random prompts of common ids (bytes' range), the target's greedy replies."""
    from transformers import AutoModelForCausalLM

    from dflash.data.format import DatasetWriter
    lm = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()
    g = torch.Generator().manual_seed(1)
    writer = DatasetWriter(work / "data", lm.config.vocab_size)
    prompts = torch.randint(300, 3000, (n_train + n_eval, 12), generator=g)
    with torch.no_grad():
        out = lm.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=64,
                          do_sample=False, pad_token_id=0)
    for row in out[:n_train]:
        mask = torch.zeros_like(row)
        mask[12:] = 1
        writer.add(row.numpy(), mask.numpy())
    writer.close()
    held = work / "heldout.jsonl"
    held.write_text("".join(json.dumps({"prompt_ids": p.tolist()}) + "\n" for p in prompts[n_train:]))
    return work / "data", held


def train(target_dir: Path, data: Path, out: Path, steps: int, anchor_first: bool) -> Path:
    """The drafter's run dir; a finished run is reused, a killed one resumes."""
    from dflash.config import compose
    from dflash.trainer import Trainer
    if (out / "summary.json").exists():
        print(f"  {out}: trained before")
        return out
    cfg = compose("train", ["resume=auto", 
        "model=hf", f"model.target.path={target_dir}", "data=tokenized", f"data.path={data}",
        "data.max_seq_len=128", "loss=dspark", "model.drafter.markov_rank=32",
        "model.drafter.confidence_head=true", f"model.drafter.sample_from_anchor={anchor_first}",
        "model.drafter.block_size=8", "model.drafter.num_anchors=16", "loss.draft_vocab=2048", "model.drafter.norm_init=1",
        "model.drafter.norm_lr_scale=1", f"optim.max_steps={steps}", "epochs=100", "optim.lr=3e-3",
        "eval.enabled=false", "logger=none", "logger.progress=false", "warmup=none"])
    s = Trainer(cfg, out).build().run()
    print(f"  trained {s['steps']} steps, loss {s['initial_loss']:.3f} -> {s['final_loss']:.3f}")
    return out


def eval_report(target_dir: Path, drafter: Path, prompts: Path, out: Path, stop: float) -> dict:
    subprocess.run([sys.executable, "-m", "dflash.eval", f"drafter={drafter}",
                    f"model.target.path={target_dir}", f"prompts={prompts}", f"out={out}",
                    "max_new_tokens=48", f"confidence_stop={stop}", "model.target.dtype=float32",
                    "device=cpu", f"hydra.run.dir={out.parent / 'hydra'}"],
                   check=True, cwd=ROOT, capture_output=True)
    return json.loads(out.read_text())


def gguf_facts(tree: Path, path: Path) -> dict:
    sys.path.insert(0, str(tree / "gguf-py"))
    from gguf import GGUFReader
    r = GGUFReader(str(path))
    facts = {}
    for key in ("dflash.sample_from_anchor", "dflash.has_confidence_head", "dflash.block_size"):
        f = r.fields.get(key)
        if f is not None:
            facts[key] = f.contents()
    for t in r.tensors:
        if "markov" in t.name or "conf_proj" in t.name or t.name == "d2t":
            facts[t.name] = [int(x) for x in t.shape]
    return facts


def serve(tree, target_dir, drafter, report, out) -> dict:
    from dflash.recipe.llama_cpp import check
    from dflash.eval.report import EvalReport
    c = check(tree, target_dir, drafter, EvalReport.from_json(report), out, threads=2)
    e = c.equal_prompts
    return {"spec_type": c.spec_type, "equal": f"{c.equal_tokens}/{c.prompts}",
            "llama_cpp": round(c.llama_cpp, 3), "dflash": round(c.dflash, 3),
            "same_accepted_per_prompt": e.same_accepted_per_prompt,
            "only_final_step_differs": e.differences_only_in_final_step}


def hazards(tree, target_dir, drafter: Path, report: dict, work: Path) -> dict:
    """The two failure modes the export avoids, made on purpose."""
    from safetensors.torch import load_file, save_file
    out = {}
    # (1) the export carries embed_tokens (the target's): the converter keeps it and, the
    # vocabulary being full, the runtime scores drafts with it instead of the LM head
    emb = work / "hazard-embed"
    shutil.copytree(drafter, emb, dirs_exist_ok=True)
    state = load_file(str(emb / "model.safetensors"))
    target = load_file(str(target_dir / "model.safetensors"))
    state["embed_tokens.weight"] = target["model.embed_tokens.weight"]
    save_file(state, str(emb / "model.safetensors"))
    out["export with embed_tokens"] = serve(tree, target_dir, emb, report, work / "gguf-embed")
    # (2) an anchor-first block served as plain DFlash: no Markov tensors, DFlash's arch
    late = work / "hazard-late"
    shutil.copytree(drafter, late, dirs_exist_ok=True)
    state = {k: v for k, v in load_file(str(late / "model.safetensors")).items()
             if not k.startswith(("markov_head.", "confidence_head."))}
    save_file(state, str(late / "model.safetensors"))
    cfg = json.loads((late / "config.json").read_text())
    cfg["architectures"] = ["DFlashDraftModel"]
    for k in ("markov_rank", "markov_head_type", "confidence_head", "markov_head_placeholder"):
        cfg.pop(k, None)
    (late / "config.json").write_text(json.dumps(cfg))
    out["anchor-first read as DFlash"] = serve(tree, target_dir, late, report, work / "gguf-late")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "dspark-serving")
    ap.add_argument("--llama-cpp", type=Path, default=ROOT / ".cache" / "llama.cpp")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--train", type=int, default=512)
    ap.add_argument("--eval", type=int, default=16)
    ap.add_argument("--stop", type=float, default=0.5)
    a = ap.parse_args()
    from dflash.recipe.llama_cpp import llama_cpp_tree
    tree = llama_cpp_tree(str(a.llama_cpp))
    a.work.mkdir(parents=True, exist_ok=True)
    # the target and its data are made once: a rerun after a stop continues from them
    target_dir = a.work / "target"
    if not (target_dir / "tokenizer_config.json").exists():  # (saved last)
        build_target(target_dir)
    data, held = a.work / "data", a.work / "heldout.jsonl"
    if not ((data / "meta.json").exists() and held.exists()):
        data, held = build_data(target_dir, a.work, a.train, a.eval)
    rows, facts = {}, {}
    for anchor_first in (False, True):
        name = "anchor-first" if anchor_first else "slot 0 = anchor"
        print(f"{name}:")
        run = train(target_dir, data, a.work / f"train-{int(anchor_first)}", a.steps, anchor_first)
        # the whole vocabulary's export, and the draft-vocabulary one (W2 and the LM head
        # over the kept ids, d2t) with the confidence stop
        for export, stop in (("drafter", 0.0), ("drafter", a.stop), ("drafter_draft_vocab", a.stop)):
            drafter, key = run / export, f"{name}, {export}, p_min {stop}"
            tag = f"{int(anchor_first)}-{export}-{stop}"
            rep = eval_report(target_dir, drafter, held, a.work / f"eval-{tag}.json", stop)
            rows[key] = serve(tree, target_dir, drafter, rep, a.work / f"gguf-{tag}")
            print(f"  {key}: {rows[key]}")
            facts[f"{name}, {export}"] = gguf_facts(tree, a.work / f"gguf-{tag}" / "drafter.gguf")
        if anchor_first:
            rep = json.loads((a.work / f"eval-{int(anchor_first)}-drafter-0.0.json").read_text())
            rows.update(hazards(tree, target_dir, run / "drafter", rep, a.work))
    print("\n| drafter | llama.cpp mode | equal tokens | acceptance llama.cpp | dflash | "
          "accepted drafts equal per prompt |")
    print("|---|---|---|---|---|---|")
    for k, r in rows.items():
        same = r["same_accepted_per_prompt"]
        print(f"| {k} | {r['spec_type']} | {r['equal']} | {r['llama_cpp']:.3f} | {r['dflash']:.3f} "
              f"| {same}{'' if same or r['only_final_step_differs'] is None else ' (final step only: ' + str(r['only_final_step_differs']) + ')'} |")
    print("\nGGUF metadata and DSpark tensors (llama.cpp's converter):")
    for k, f in facts.items():
        print(f"  {k}: {json.dumps(f)}")
    (a.work / "report.json").write_text(json.dumps({"rows": rows, "gguf": facts}, indent=2))


if __name__ == "__main__":
    main()
