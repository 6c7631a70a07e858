#!/usr/bin/env python3
"""Prefill 512 and batch-1 decode of GGUF files: the engine's `decode_bench` against llama.cpp's
`llama-bench` on the same file and thread count, in alternating pairs.

A VM's memory bandwidth can move by half between runs minutes apart, and a batch-1 decode
reads every weight once a token, so one round of "ours, then theirs" says little about a
ratio near 1. This runs ROUNDS pairs per file, ours first in odd rounds and llama-bench first
in even ones (a drift then favours neither), takes each pair's ratio, and reports the median
and the range of those ratios, the ratio of each side's best run, and the engine's step as a
fraction of the bandwidth floor it measured in the same run.

Each pair also records where the host put the VM's two threads: `decode_bench` bounces a
cache line between two threads before and after each side's run (`core_to_core_ns`). On one
chiplet (tens of ns) the threads share an L3 and one link to memory; across two (hundreds)
the bandwidth probe reads up to twice as much while every hand-off between threads costs
several times as long, so a floor fraction from such a round measures the placement, not the
engine. The summary gives the medians over all rounds and over each placement's rounds (the
floor fraction placed by our run's own readings, the ratios by the whole pair's).

    python3 bench/gguf_vs_llama.py [--rounds 6] [--level avx2] [--llama-bench PATH]
        [--decode-tokens N] [--threads 2] FILE...

`--level` sets `KERNELS_CPU_LEVEL` for the engine; give it llama.cpp built for the same ISA
(`models-cache/llama-cpp/build-avx2/bin/llama-bench`, made as BENCHMARKS.md says) for a
same-ISA comparison. Decode tokens default to 128, 64 for files over 400 MB. Prints one JSON
line per pair and one summary line per file. Build the engine's side first:
`cargo build --release -p engine --example decode_bench`.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = os.path.join(ROOT, "target", "release", "examples", "decode_bench")
LLAMA = os.path.join(ROOT, "models-cache", "llama-cpp", "build", "bin", "llama-bench")


def run(cmd, env=None):
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def ours(path, n_dec, threads, level):
    env = dict(os.environ)
    if level:
        env["KERNELS_CPU_LEVEL"] = level
    out = run(
        [OURS, "--model", path, "--threads", str(threads), "--batches", "1",
         "--prefill", "512", "--decode-tokens", str(n_dec)],
        env,
    )
    line = json.loads(out.strip().splitlines()[-1])
    return {
        "prefill": line["prefill_512_tok_s"],
        # From the step time, which has more digits than the tok/s field.
        "decode": 1000.0 / line["decode_b1_step_ms"],
        "floor_fraction": line["decode_b1_floor_fraction"],
        "read_gbs": line["read_gbs"],
        "cpu_level": line["cpu_level"],
        "core_to_core_ns": line.get("core_to_core_ns"),
    }


def core_to_core(threads):
    """The cache-line round trip between two threads now (None with one thread)."""
    if threads < 2:
        return None
    return json.loads(run([OURS, "--core-to-core-only"]).strip())["core_to_core_ns"]


# Round trips below this are one chiplet, above TWO_CHIPLETS_NS two; between, or a pair whose
# readings disagree, the placement moved during the pair.
ONE_CHIPLET_NS = 150
TWO_CHIPLETS_NS = 250


def placement(readings):
    if not readings or any(r is None for r in readings):
        return "unknown"
    if all(r < ONE_CHIPLET_NS for r in readings):
        return "one_chiplet"
    if all(r > TWO_CHIPLETS_NS for r in readings):
        return "two_chiplets"
    return "moved"


def theirs(llama, path, n_dec, threads):
    out = run([llama, "-m", path, "-t", str(threads), "-p", "512", "-n", str(n_dec),
               "-r", "1", "-o", "json"])
    tests = json.loads(out)
    pp = next(t["avg_ts"] for t in tests if t["n_prompt"] > 0)
    tg = next(t["avg_ts"] for t in tests if t["n_gen"] > 0)
    return {"prefill": pp, "decode": tg}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--level", default="")
    ap.add_argument("--llama-bench", default=LLAMA)
    ap.add_argument("--decode-tokens", type=int, default=0)
    args = ap.parse_args()
    for tool in (OURS, args.llama_bench):
        if not os.access(tool, os.X_OK):
            sys.exit(f"not built: {tool}")
    for path in args.files:
        if not os.path.isfile(path):
            sys.exit(f"no such file: {path}")
    pairs = {path: [] for path in args.files}
    for r in range(1, args.rounds + 1):
        for path in args.files:
            n_dec = args.decode_tokens or (64 if os.path.getsize(path) > 400e6 else 128)
            c2c = []

            def peer():
                c2c.append(core_to_core(args.threads))
                got = theirs(args.llama_bench, path, n_dec, args.threads)
                c2c.append(core_to_core(args.threads))
                return got

            if r % 2:
                a = ours(path, n_dec, args.threads, args.level)
                b = peer()
            else:
                b = peer()
                a = ours(path, n_dec, args.threads, args.level)
            c2c += a["core_to_core_ns"] or [None]
            pair = {
                "round": r,
                "file": os.path.basename(path),
                "ours": a,
                "llama_bench": b,
                "prefill_ratio": round(a["prefill"] / b["prefill"], 3),
                "decode_ratio": round(a["decode"] / b["decode"], 3),
                # Ours alone (the floor fraction's run), and the whole pair (the ratios').
                "placement_ours": placement(a["core_to_core_ns"]),
                "placement": placement(c2c),
            }
            pairs[path].append(pair)
            print(json.dumps(pair), flush=True)
    for path, got in pairs.items():
        summary = {"file": os.path.basename(path), "rounds": len(got), "level": args.level or "native"}
        for key in ("prefill_ratio", "decode_ratio"):
            vals = [p[key] for p in got]
            summary[key] = {"median": round(statistics.median(vals), 3),
                            "min": min(vals), "max": max(vals)}
        # The host's bandwidth can jump between two levels for minutes: the best run of each
        # side is the other figure a noisy machine gives.
        for key in ("prefill", "decode"):
            best_ours = max(p["ours"][key] for p in got)
            best_theirs = max(p["llama_bench"][key] for p in got)
            summary[f"{key}_best"] = {"ours": round(best_ours, 1), "llama_bench": round(best_theirs, 1),
                                      "ratio": round(best_ours / best_theirs, 3)}
        fr = [p["ours"]["floor_fraction"] for p in got]
        summary["floor_fraction"] = {"median": round(statistics.median(fr), 3),
                                     "min": min(fr), "max": max(fr)}
        # The floor fraction by where our run alone ran, the ratios by where the whole pair did.
        for name, field, keys in (
                ("floor_fraction_by_placement", "placement_ours",
                 (("floor_fraction", lambda p: p["ours"]["floor_fraction"]),)),
                ("ratios_by_placement", "placement",
                 (("decode_ratio", lambda p: p["decode_ratio"]),
                  ("prefill_ratio", lambda p: p["prefill_ratio"])))):
            by_place = {}
            for where in sorted({p[field] for p in got}):
                some = [p for p in got if p[field] == where]
                by_place[where] = {"rounds": len(some)}
                for key, get in keys:
                    by_place[where][key] = round(statistics.median(get(p) for p in some), 3)
            summary[name] = by_place
        print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main()
