#!/usr/bin/env python3
"""References for RoPE that depends on the context: Phi-3's `longrope` on the committed tiny
Phi-3 (pretrained context 32, random short and long factors) and `dynamic` NTK on the tiny
Llama (factor 4 over a context of 32), run by transformers in float32 on the stored bf16
weights. transformers picks by each forward's length: the whole 48-token prompt runs past 32
(long factors; a base grown for 48 tokens), its first 24 tokens do not (short factors; the
plain base). Writes tests/data/context_rope_reference.json for `engine/tests/rope_scaling.rs`.

    python scripts/tiny_context_rope_reference.py     # needs torch and transformers
"""

import json
import os
import shutil
import tempfile

import torch
import transformers

from tiny_top5 import made_by, top5

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "tests", "data")
PROMPT = [(i * 37 + 11) % 1000 for i in range(48)]


def variants():
    gen = torch.Generator().manual_seed(5)

    def rand(lo, hi):
        return [round(lo + (hi - lo) * float(x), 4) for x in torch.rand(8, generator=gen)]

    yield "longrope", "tiny-phi3", {
        "rope_parameters": {"rope_type": "longrope", "short_factor": rand(1.0, 2.0),
                            "long_factor": rand(1.0, 8.0), "rope_theta": 10000.0},
        "original_max_position_embeddings": 32, "max_position_embeddings": 128}
    yield "dynamic", "tiny-llama", {
        "rope_parameters": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0},
        "max_position_embeddings": 32}


def main():
    torch.set_num_threads(1)
    out = {"made_by": made_by("scripts/tiny_context_rope_reference.py",
                              "CPU, float32 on the bf16 weights"),
           "prompt_ids": PROMPT, "variants": {}}
    for name, folder, edit in variants():
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(os.path.join(DATA, folder, "model.safetensors"), d)
            with open(os.path.join(DATA, folder, "config.json")) as f:
                config = json.load(f)
            config.pop("rope_scaling", None)
            config.pop("rope_theta", None)
            config.update(edit)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(config, f, indent=2)
            model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
            out["variants"][name] = {"folder": folder, "config": edit,
                                     "long": top5(model, PROMPT), "short": top5(model, PROMPT[:24])}
    with open(os.path.join(DATA, "context_rope_reference.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
