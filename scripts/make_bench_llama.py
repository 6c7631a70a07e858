#!/usr/bin/env python3
"""A ~1 GB bf16 Llama-shaped HF checkpoint with random weights, for bench/preload.sh.

Standard library only (no numpy or torch here). The tokenizer, its config and the chat
template are tests/data/tiny-llama's, so the vocabulary is that tokenizer's 1024 ids and the
size is in the layers: hidden 2048, 32 heads (8 KV heads of 64), FFN 5632, 11 layers, tied
embeddings; 1.0 GB of BF16 in one model.safetensors. Matrix values are random with magnitudes
in [2^-7, 2^-5) (random bytes with the exponent pinned, so no NaN or infinity); norm weights
are 1.0. The output is for timing loads, not for reading.

    scripts/make_bench_llama.py [OUT_DIR, default target/bench-llama-1b]
"""

import json
import os
import shutil
import struct
import sys

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, VOCAB = 2048, 32, 8, 64, 5632, 11, 1024
TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tiny-llama")

# The high byte of a bf16 is sign + the exponent's top 7 bits: keep the sign, pin the exponent
# to 0x78 or 0x79 (the low byte's top bit decides).
HIGH = bytes((b & 0x80) | 0x3C for b in range(256))
ONE = struct.pack("<H", 0x3F80)


def tensors():
    kv = KV_HEADS * HEAD_DIM
    yield "model.embed_tokens.weight", [VOCAB, HIDDEN]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", [HIDDEN]
        yield p + "self_attn.q_proj.weight", [HEADS * HEAD_DIM, HIDDEN]
        yield p + "self_attn.k_proj.weight", [kv, HIDDEN]
        yield p + "self_attn.v_proj.weight", [kv, HIDDEN]
        yield p + "self_attn.o_proj.weight", [HIDDEN, HEADS * HEAD_DIM]
        yield p + "post_attention_layernorm.weight", [HIDDEN]
        yield p + "mlp.gate_proj.weight", [FFN, HIDDEN]
        yield p + "mlp.up_proj.weight", [FFN, HIDDEN]
        yield p + "mlp.down_proj.weight", [HIDDEN, FFN]
    yield "model.norm.weight", [HIDDEN]


def values(name, count):
    if name.endswith("norm.weight"):
        return ONE * count
    buf = bytearray(os.urandom(2 * count))
    buf[1::2] = bytes(buf[1::2]).translate(HIGH)
    return buf


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "target/bench-llama-1b"
    os.makedirs(out, exist_ok=True)
    header, offset, order = {}, 0, list(tensors())
    for name, shape in order:
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path = os.path.join(out, "model.safetensors")
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape in order:
            count = 1
            for d in shape:
                count *= d
            f.write(values(name, count))
    os.replace(path + ".tmp", path)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "bos_token_id": 1020,
        "eos_token_id": 1021,
        "torch_dtype": "bfloat16",
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TINY, name), os.path.join(out, name))
    print(f"{out}: {len(order)} tensors, {offset / 1e9:.2f} GB of BF16")


if __name__ == "__main__":
    main()
