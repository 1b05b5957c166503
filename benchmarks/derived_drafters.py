"""The production drafter experiment=production derives for the real configs the docs name
(config.json + tokenizer_config.json only, written from the models' public files by
tests/helpers/model_fixtures.py): depth, taps, mask id and the drafter's training state.

    python benchmarks/derived_drafters.py
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PUBLISHED = {"Qwen3-8B": "z-lab Qwen3-8B-DFlash-b16: 5 layers, [1, 9, 17, 25, 33], 151669"}


def main() -> None:
    from dflash.model.derive import state_gib
    from tests.helpers.model_fixtures import MODELS, write_model
    from tests.unit.test_derivation import derived
    print("| target | layers x width | drafter depth | taps | mask id | drafter state | published |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            path = write_model(Path(tmp), name)
            d = derived(path)
            cfg = MODELS[name][0]
            print(f"| {name} | {cfg['num_hidden_layers']} x {cfg['hidden_size']} | "
                  f"{d['num_layers']} | {d['layer_ids']} | {d['mask_token_id']} | "
                  f"{state_gib(path, d['num_layers']):.1f} GiB | {PUBLISHED.get(name, '-')} |")


if __name__ == "__main__":
    main()
