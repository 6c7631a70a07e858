#!/usr/bin/env python3
"""A tiny random-weight Phi-3 checkpoint (fused `qkv_proj` and `gate_up_proj`) and its
transformers reference, for `engine/tests/phi3.rs`:

    python scripts/make_tiny_phi3.py     # needs torch and transformers; writes tests/data/tiny-phi3

The tokenizer is tiny-llama's (vocabulary 1024). The reference is transformers' float32 top-5
logprobs at every position of a fixed 48-token prompt, on the stored bf16 weights.
Deterministic: fixed seed, one thread.
"""

import os
import shutil

import torch
import transformers

from tiny_top5 import top5, write_reference

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "data", "tiny-phi3")
TINY = os.path.join(ROOT, "tests", "data", "tiny-llama")
PROMPT = [(i * 37 + 11) % 1000 for i in range(48)]


def main():
    torch.manual_seed(3)
    torch.set_num_threads(1)
    config = transformers.Phi3Config(
        vocab_size=1024, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        original_max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-5,
        sliding_window=None, tie_word_embeddings=False, bos_token_id=1020, eos_token_id=1021,
        pad_token_id=1021, initializer_range=0.2,
    )
    model = transformers.Phi3ForCausalLM(config).to(torch.bfloat16).eval()
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TINY, name), OUT)
    for extra in ("generation_config.json",):
        p = os.path.join(OUT, extra)
        if os.path.exists(p):
            os.remove(p)
    model = transformers.AutoModelForCausalLM.from_pretrained(OUT, dtype=torch.float32).eval()
    write_reference(os.path.join(OUT, "reference.json"), "scripts/make_tiny_phi3.py",
                    "CPU, float32 on the bf16 weights", PROMPT, top5(model, PROMPT))
    print("wrote", OUT, sorted(os.listdir(OUT)))


if __name__ == "__main__":
    main()
