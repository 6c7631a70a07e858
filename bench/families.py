#!/usr/bin/env python3
"""Decode and prefill tokens/s of a 1B-class Llama-3.2-shaped and a Gemma-2-2B-shaped random
bf16 checkpoint: transformers (eager attention, bfloat16, torch threads = N) against the
engine's `decode_bench` on the same folder and thread count, in the same run.

    python bench/families.py [--threads 2] [--rounds 3] [--work DIR] [--only NAME]

Needs torch and transformers (models-cache/torch-venv) and a release build of the engine's
example (`cargo build --release -p engine --example decode_bench`). Writes the checkpoints
(2.5 and 5.2 GB) under --work once and reuses them. Prints one JSON line per model.

Shapes: Llama-3.2-1B (hidden 2048, 16 layers, 32 heads / 8 KV, FFN 8192, vocab 128256, tied,
llama3 RoPE scaling), Gemma-2-2B (hidden 2304, 26 layers, 8 heads / 4 KV, head dim 256, FFN
9216, vocab 256000, windows of 4096, soft-capping). Prefill: a 128-token prompt, the forward
pass of the whole prompt; decode: 64 greedy steps of batch 1 after it, cache kept.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SHAPES = {
    "llama-3.2-1b": lambda: transformers.LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        bos_token_id=128000, eos_token_id=128001),
    "gemma-2-2b": lambda: transformers.Gemma2Config(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=4096, max_position_embeddings=8192, bos_token_id=2, eos_token_id=1),
}
CLASSES = {"llama-3.2-1b": transformers.LlamaForCausalLM, "gemma-2-2b": transformers.Gemma2ForCausalLM}
PROMPT = 128
DECODE = 64


def make(name, folder):
    if os.path.exists(os.path.join(folder, "config.json")):
        return
    torch.manual_seed(0)
    config = SHAPES[name]()
    config.architectures = [CLASSES[name].__name__]
    with torch.device("meta"):
        model = CLASSES[name](config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(0.0 if "gemma" in name else 1.0)
    model.save_pretrained(folder)
    tiny = os.path.join(ROOT, "tests", "data", "tiny-llama")
    # The tokenizer only names the special tokens here: the benchmark feeds ids.
    for f in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(tiny, f)) as src, open(os.path.join(folder, f), "w") as dst:
            dst.write(src.read())


def transformers_rates(folder, threads, rounds):
    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16, attn_implementation="eager").eval()
    ids = torch.arange(10, 10 + PROMPT).unsqueeze(0)
    prefill, decode = [], []
    with torch.no_grad():
        for _ in range(rounds + 1):
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            t1 = time.perf_counter()
            past = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            t2 = time.perf_counter()
            for _ in range(DECODE):
                out = model(tok, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)
            t3 = time.perf_counter()
            prefill.append(PROMPT / (t1 - t0))
            decode.append(DECODE / (t3 - t2))
    # The first round warms up.
    return statistics.median(prefill[1:]), statistics.median(decode[1:])


def engine_rates(folder, threads):
    exe = os.path.join(ROOT, "target", "release", "examples", "decode_bench")
    out = subprocess.run([exe, "--threads", str(threads), "--model", folder, "--batches", "1",
                          "--prefill", str(PROMPT), "--decode-tokens", str(DECODE)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(ROOT, "models-cache", "bench-families"))
    ap.add_argument("--only", choices=sorted(SHAPES), help="one model only")
    args = ap.parse_args()
    for name in [args.only] if args.only else SHAPES:
        folder = os.path.join(args.work, name)
        make(name, folder)
        hf_prefill, hf_decode = transformers_rates(folder, args.threads, args.rounds)
        ours = engine_rates(folder, args.threads)
        print(json.dumps({"model": name, "threads": args.threads,
                          "transformers": {"prefill_tok_s": round(hf_prefill, 2),
                                           "decode_tok_s": round(hf_decode, 2)},
                          "engine": ours,
                          "ratio_prefill": round(ours[f"prefill_{PROMPT}_tok_s"] / hf_prefill, 2),
                          "ratio_decode": round(ours["decode_b1_tok_s"] / hf_decode, 2)}),
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
