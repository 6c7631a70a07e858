#!/usr/bin/env python3
"""Tiny random-weight checkpoints of the decoder families that differ from Llama (Gemma 2,
Gemma 3 text, Mistral with a sliding window) and their transformers references, for
`engine/tests/families.rs`:

    python scripts/make_tiny_families.py     # needs torch and transformers; writes tests/data/tiny-<family>

Each has 2-4 layers of width 64 in bf16, the tokenizer of tiny-llama (vocabulary 1024), and a
sliding window of 12 tokens, so the 48-token prompt runs past every window. Norm weights are
random too (Gemma stores w - 1, so zeros would hide a missing offset), and Gemma 2's
soft-capping thresholds are low enough that the tanh bends the numbers. The reference is
transformers' float32 top-5 logprobs at every position, on the stored bf16 weights.
Deterministic: fixed seeds, one thread.
"""

import os
import shutil

import torch
import transformers

from tiny_top5 import top5, write_reference

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "tests", "data")
TINY = os.path.join(DATA, "tiny-llama")
PROMPT = [(i * 37 + 11) % 1000 for i in range(48)]
COMMON = dict(
    vocab_size=1024, hidden_size=64, intermediate_size=160, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, rms_norm_eps=1e-6,
    bos_token_id=1020, eos_token_id=1021, pad_token_id=1021, initializer_range=0.2,
)


def families():
    yield "tiny-gemma2", 5, transformers.Gemma2ForCausalLM, transformers.Gemma2Config(
        num_hidden_layers=4, sliding_window=12, query_pre_attn_scalar=24,
        attn_logit_softcapping=4.0, final_logit_softcapping=6.0, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **COMMON)
    yield "tiny-gemma3", 6, transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(
        num_hidden_layers=3, sliding_window=12, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
        },
        tie_word_embeddings=True, **COMMON)
    yield "tiny-mistral-swa", 7, transformers.MistralForCausalLM, transformers.MistralConfig(
        num_hidden_layers=2, sliding_window=12, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **COMMON)


def main():
    torch.set_num_threads(1)
    for name, seed, cls, config in families():
        torch.manual_seed(seed)
        out = os.path.join(DATA, name)
        model = cls(config)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if p.dim() == 1:
                    p.normal_(0.0, 0.3)
        model = model.to(torch.bfloat16).eval()
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(TINY, f), out)
        gen = os.path.join(out, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            out, dtype=torch.float32, attn_implementation="eager").eval()
        write_reference(os.path.join(out, "reference.json"), "scripts/make_tiny_families.py",
                        "CPU, float32 eager attention on the bf16 weights", PROMPT,
                        top5(model, PROMPT))
        print("wrote", out, sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
