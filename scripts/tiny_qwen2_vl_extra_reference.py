#!/usr/bin/env python3
"""Extra reference outputs of the tiny Qwen2-VL checkpoint for the engine's unit-level parity
tests (engine/tests/qwen2_vl_parity.rs), next to what scripts/make_tiny_mm_models.py writes:

  tests/data/tiny-qwen2-vl/vision_reference.json  the vision tower's merged output for two grids
      ([1,4,6] and [2,4,4] patches) on pixel values given by a formula the Rust test recomputes:
      value i = sin(0.37 i) * 0.8 + cos(0.011 i) * 0.3 (computed in float64, stored as float32);
  tests/data/tiny-qwen2-vl/text_reference.json    a text-only prompt's token ids and the logits
      at two positions (text only: M-RoPE's three positions are equal, i.e. plain RoPE).

Run (torch CPU and transformers installed): python scripts/tiny_qwen2_vl_extra_reference.py
Deterministic: no randomness, the checkpoint is read as committed.
"""
import json
import math
import os

import torch
from tokenizers import Tokenizer
from transformers import Qwen2VLForConditionalGeneration

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tiny-qwen2-vl")


def main():
    model = Qwen2VLForConditionalGeneration.from_pretrained(DIR, torch_dtype=torch.float32).eval()
    grids = [[1, 4, 6], [2, 4, 4]]
    n = sum(t * h * w for t, h, w in grids)
    patch = 3 * 2 * 14 * 14
    pixels = torch.tensor(
        [math.sin(i * 0.37) * 0.8 + math.cos(i * 0.011) * 0.3 for i in range(n * patch)], dtype=torch.float32
    ).view(n, patch)
    with torch.no_grad():
        out = model.model.visual(pixels, grid_thw=torch.tensor(grids))
    pooled = out.pooler_output
    with open(os.path.join(DIR, "vision_reference.json"), "w") as f:
        json.dump({"grids": grids, "formula": "sin(i*0.37)*0.8 + cos(i*0.011)*0.3", "shape": list(pooled.shape),
                   "values": [round(float(v), 7) for v in pooled.flatten()]}, f)

    tok = Tokenizer.from_file(os.path.join(DIR, "tokenizer.json"))
    text = "The river model serves a request for the market and the school."
    ids = tok.encode(text, add_special_tokens=False).ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    with open(os.path.join(DIR, "text_reference.json"), "w") as f:
        json.dump({"text": text, "token_ids": ids,
                   "logits": {str(p): [round(float(v), 6) for v in logits[p]] for p in [3, len(ids) - 1]}}, f)


if __name__ == "__main__":
    main()
