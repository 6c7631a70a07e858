#!/usr/bin/env python3
"""RoPE scaling references for the engine's HF loader: the committed tiny Llama
(tests/data/tiny-llama) under each scaling type of config.json, run by transformers in float32
on the stored bf16 weights. Writes tests/data/tiny-llama/rope_reference.json: per variant the
`rope_scaling` object, and for a fixed 48-token prompt the top-5 logprobs at every position.

    python scripts/tiny_rope_reference.py        # needs torch and transformers

`engine/tests/rope_scaling.rs` copies the folder, writes each variant's config.json, and
compares its own f32 logprobs. Deterministic: no random state is used.
"""

import json
import os
import shutil
import tempfile

import torch
import transformers

from tiny_top5 import top5

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TINY = os.path.join(ROOT, "tests", "data", "tiny-llama")

# Scaling that moves the tiny model's frequencies: with head_dim 16 and theta 10000 the
# wavelengths run from 6 to about 20000 positions, so an original context of 32 (shorter than
# the 48-token prompt) puts some frequencies above, some below and some between the llama3
# thresholds.
VARIANTS = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "yarn-mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                    "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16, "beta_slow": 2},
    "linear": {"rope_type": "linear", "factor": 4.0},
}

PROMPT = [(i * 37 + 11) % 1000 for i in range(48)]


def run(variant, scaling):
    with tempfile.TemporaryDirectory() as d:
        for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(TINY, name), d)
        config = json.load(open(os.path.join(TINY, "config.json")))
        config.pop("rope_parameters", None)
        config["rope_theta"] = 10000.0
        config["rope_scaling"] = scaling
        json.dump(config, open(os.path.join(d, "config.json"), "w"), indent=2)
        model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        model.eval()
        got = model.config.rope_parameters if hasattr(model.config, "rope_parameters") else None
        print(variant, "transformers reads", got)
        return top5(model, PROMPT)


def main():
    torch.set_num_threads(1)
    out = {
        "made_by": f"scripts/tiny_rope_reference.py (transformers {transformers.__version__}, "
                   f"torch {torch.__version__.split('+')[0]}, CPU, float32)",
        "prompt_ids": PROMPT,
        "variants": {name: {"rope_scaling": s, "top5": run(name, s)}
                     for name, s in VARIANTS.items()},
    }
    # The unscaled model as well: the test checks that each variant moves the logprobs.
    out["variants"]["default"] = {"rope_scaling": None, "top5": run("default", {"rope_type": "default"})}
    path = os.path.join(TINY, "rope_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
