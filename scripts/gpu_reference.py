#!/usr/bin/env python3
"""Checkpoints, reference outputs and peer timings for the GPU checks (scripts/gpu-check.sh).

Made with torch and transformers where the check runs, since no checkpoint can travel to the
GPU machine (64 MiB) and it has no network:

  make       a random-init Llama-shaped checkpoint in bf16 (save_pretrained), with a byte-level
             tokenizer of the model's vocabulary and a Llama-3-style chat template, so the
             gateway can serve it; initialised on the GPU where there is one (a 1B model's
             init takes minutes on a CPU);
  spread     transformers' own bfloat16 run against a reference's float32 one (also written by
             `reference`): the tolerance of the GPU decoder's bfloat16 parity;
  reference  greedy continuations of fixed prompts by transformers in float32 (TF32 off) on the
             stored bf16 weights: per step the token, the top-5 logprobs and the top-2 margin;
  prepare    `make` then `reference` for each SHAPE=DIR given, in one process (torch starts
             once), the reference in DIR/reference.json;
  time       transformers eager decode step time at batch 1 (bf16, KV cache) and the device's
             copy bandwidth, measured in the same run as our figures.

Shapes: `smol` is SmolLM2-135M's, `1b` Llama-3.2-1B's (hidden 2048, 16 layers, 32 heads, 8 KV
heads, intermediate 8192, vocab 128256), `tiny` a small one for checking this script on a CPU.
"""

import argparse
import json
import os
import statistics
import time

import torch

SHAPES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=160, vocab_size=1024,
                 rope_theta=10000.0, max_position_embeddings=2048),
    "smol": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                 rope_theta=100000.0, max_position_embeddings=8192),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
               rope_theta=500000.0, max_position_embeddings=8192),
}

SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def byte_chars():
    """GPT-2's byte-to-unicode table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tokenizer(out, vocab_size):
    """A byte-level BPE without merges: ids 0..255 are the bytes, then filler words up to the
    vocabulary's size, the last four ids special tokens."""
    chars = byte_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    n_fill = vocab_size - 256 - len(SPECIALS)
    for i in range(n_fill):
        vocab[f"w{i}"] = 256 + i
    specials = {s: vocab_size - len(SPECIALS) + k for k, s in enumerate(SPECIALS)}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for s, i in specials.items()],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []},
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
                   "chat_template": CHAT_TEMPLATE}, f)
    return specials


def cmd_make(a):
    print(json.dumps(make(a.shape, a.out, a.seed, a.init_std)))


def make(shape_name, out, seed, init_std):
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.perf_counter()
    shape = SHAPES[shape_name]
    vocab = shape["vocab_size"]
    bos, eos = vocab - len(SPECIALS), vocab - len(SPECIALS) + 1
    cfg = LlamaConfig(**shape, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      initializer_range=init_std, bos_token_id=bos, eos_token_id=eos,
                      dtype="bfloat16", hidden_act="silu")
    torch.manual_seed(seed)
    with torch.device(device()):
        model = LlamaForCausalLM(cfg)
    made_on = str(next(model.parameters()).device)
    # Norm weights around 1 rather than exactly 1, so a missing norm weight shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.8, 1.2)
    model = model.to(torch.bfloat16)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    write_tokenizer(out, vocab)
    return {"made": out, "shape": shape_name, "initialised_on": made_on,
            "parameters": sum(p.numel() for p in model.parameters()),
            "seconds": round(time.perf_counter() - t0, 1)}


def prompts(vocab, n):
    """Fixed prompts of ordinary (non-special) token ids, of different lengths."""
    g = torch.Generator().manual_seed(1234)
    lengths = [5, 12, 31, 64, 100, 7, 19, 47][:n]
    top = vocab - len(SPECIALS)
    return [torch.randint(0, top, (n_,), generator=g).tolist() for n_ in lengths]


def cmd_reference(a):
    print(json.dumps(reference(a.model, a.out, a.prompts, a.new_tokens)))


def reference(model_dir, out, n_prompts, new_tokens):
    from transformers import LlamaForCausalLM

    t0 = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = device()
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
    vocab = model.config.vocab_size
    cases = []
    with torch.no_grad():
        for ids in prompts(vocab, n_prompts):
            seq = list(ids)
            steps = []
            for _ in range(new_tokens):
                # Full recompute each step: the reference has no cache to get wrong.
                logits = model(torch.tensor([seq], device=dev)).logits[0, -1].double()
                lp = torch.log_softmax(logits, dim=-1)
                top = torch.topk(logits, 5)
                margin = float(top.values[0] - top.values[1])
                tok = int(top.indices[0])
                steps.append({"token": tok, "margin": margin,
                              "top5": [[int(i), float(lp[i])] for i in top.indices]})
                seq.append(tok)
            cases.append({"prompt_ids": ids, "steps": steps})
    del model
    spread = bf16_spread(model_dir, cases, dev)
    with open(out, "w") as f:
        json.dump({"model": model_dir, "dtype": "float32", "device": str(dev), "cases": cases,
                   "bf16_vs_float32": spread}, f)
    return {"reference": out, "device": str(dev), "cases": len(cases), "new_tokens": new_tokens,
            "bf16_vs_float32": spread, "seconds": round(time.perf_counter() - t0, 1)}


def bf16_spread(model_dir, cases, dev):
    """How far transformers' own bfloat16 run lands from its float32 reference on the same
    checkpoint and tokens (teacher-forced): the largest top-5 logprob difference, and the steps
    whose greedy token differs with the largest reference margin among them. The GPU parity
    test sets its bfloat16 tolerance from these."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(dev).eval()
    worst, flips, flip_margin, steps = 0.0, 0, 0.0, 0
    with torch.no_grad():
        for case in cases:
            seq = list(case["prompt_ids"])
            for step in case["steps"]:
                logits = model(torch.tensor([seq], device=dev)).logits[0, -1].double()
                lp = torch.log_softmax(logits, dim=-1)
                for i, want in step["top5"]:
                    worst = max(worst, abs(float(lp[i]) - want))
                if int(torch.argmax(logits)) != step["token"]:
                    flips += 1
                    flip_margin = max(flip_margin, step["margin"])
                steps += 1
                seq.append(step["token"])
    return {"worst_top5": worst, "greedy_flips": flips, "largest_flip_margin": flip_margin,
            "steps": steps}


def cmd_spread(a):
    """Add the bfloat16 spread to an existing reference (made by `reference`)."""
    with open(a.reference) as f:
        ref = json.load(f)
    ref["bf16_vs_float32"] = bf16_spread(a.model, ref["cases"], device())
    with open(a.reference, "w") as f:
        json.dump(ref, f)
    print(json.dumps(ref["bf16_vs_float32"]))


def cmd_prepare(a):
    for pair in a.models:
        shape, _, out = pair.partition("=")
        if shape not in SHAPES or not out:
            raise SystemExit(f"prepare takes SHAPE=DIR with a shape of {sorted(SHAPES)}: {pair}")
        print(json.dumps(make(shape, out, a.seed, a.init_std)), flush=True)
        print(json.dumps(reference(out, os.path.join(out, "reference.json"), a.prompts,
                                   a.new_tokens)), flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def cmd_time(a):
    from transformers import LlamaForCausalLM

    dev = device()
    out = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__}
    # Copy bandwidth: bytes read plus bytes written, best of 10 (the floor's denominator).
    n = (a.copy_gib << 30) // 4
    x = torch.randn(n, device=dev)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(12):
        sync()
        t0 = time.perf_counter()
        y.copy_(x)
        sync()
        best = min(best, time.perf_counter() - t0)
    out["copy_gb_s"] = round(2 * x.numel() * 4 / best / 1e9, 1)
    del x, y
    model = LlamaForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16,
                                             attn_implementation="eager").to(dev).eval()
    out["weight_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab - len(SPECIALS), (1, 32), device=dev)
    with torch.no_grad():
        for _ in range(2):  # warm-up
            model(ids)
        r = model(ids, use_cache=True)
        past, tok = r.past_key_values, r.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(a.steps):
            sync()
            t0 = time.perf_counter()
            r = model(tok, past_key_values=past, use_cache=True)
            past, tok = r.past_key_values, r.logits[:, -1:].argmax(-1)
            sync()
            times.append(time.perf_counter() - t0)
    out["transformers_eager_decode_b1_step_ms"] = round(statistics.median(times) * 1e3, 3)
    out["transformers_steps"] = a.steps
    with open(a.out, "w") as f:
        json.dump(out, f)
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--shape", choices=sorted(SHAPES), required=True)
    m.add_argument("--out", required=True)
    r = sub.add_parser("reference")
    r.add_argument("--model", required=True)
    r.add_argument("--out", required=True)
    b = sub.add_parser("prepare")
    b.add_argument("models", nargs="+", metavar="SHAPE=DIR")
    for q in (m, b):
        q.add_argument("--seed", type=int, default=7)
        q.add_argument("--init-std", type=float, default=0.04,
                       help="weights' std: larger than the usual 0.02 so greedy margins are wide")
    for q in (r, b):
        q.add_argument("--prompts", type=int, default=5)
        q.add_argument("--new-tokens", type=int, default=12)
    sp = sub.add_parser("spread")
    sp.add_argument("--model", required=True)
    sp.add_argument("--reference", required=True)
    t = sub.add_parser("time")
    t.add_argument("--model", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=64)
    t.add_argument("--copy-gib", type=int, default=4)
    a = p.parse_args()
    {"make": cmd_make, "reference": cmd_reference, "prepare": cmd_prepare,
     "spread": cmd_spread, "time": cmd_time}[a.cmd](a)


if __name__ == "__main__":
    main()
