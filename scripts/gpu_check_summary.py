#!/usr/bin/env python3
"""The running summary of scripts/gpu-check.sh: $OUT/summary.json and $OUT/summary.txt, rewritten
after every section (and when one starts), so that a run killed at any point still returns what
it learned. Standard library only.

  start  --out DIR --mode MODE --deadline S --elapsed S [--manifest FILE]
  begin  --out DIR --name NAME --limit S
  end    --out DIR --name NAME --verdict V --seconds S --limit S --log FILE [--figures FILE]
  finish --out DIR   (also prints the summary, ending on "gpu-check: N passed, N failed, N skipped")

Verdicts: PASS, SKIP (...) for an optional section that could not run here, FAIL (...) and
NOT RUN (...) (a required section the deadline left no time for). The run's verdict is FAIL
when any section failed or did not run, INCOMPLETE while the summary has not been finished (the
run was killed), PASS otherwise.
"""

import argparse
import json
import os
import re
import time

ANSI = re.compile(r"\x1b\[[0-9;]*m")
TEST_RESULT = re.compile(r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored")
TAIL_LINES = 15


def path(out):
    return os.path.join(out, "summary.json")


def load(out):
    with open(path(out)) as f:
        return json.load(f)


def verdict_of(s):
    words = [x["verdict"].split()[0] for x in s["sections"]]
    if "FAIL" in words or "NOT" in words:
        return "FAIL"
    return "PASS" if s.get("finished") else "INCOMPLETE"


def save(out, s):
    s["verdict"] = verdict_of(s)
    tmp = path(out) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(s, f, indent=1)
    os.replace(tmp, path(out))
    lines = [f"gpu-check {s['mode']}: {s['verdict']} after {s.get('elapsed_s', 0)} s "
             f"(deadline {s['deadline_s']} s)"]
    for x in s["sections"]:
        lines.append(f"{x['name']:10} {x['verdict']:48} {x['seconds']:4} s of {x['limit']}")
    if s.get("running"):
        r = s["running"]
        lines.append(f"{r['name']:10} running since {r['started_s']} s, limit {r['limit']} s")
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def elapsed(s):
    return round(time.time() - s["started_unix"])


def figures_from_log(text):
    """What every section's log can tell: the Rust tests' pass/fail counts."""
    counts = [0, 0, 0]
    for m in TEST_RESULT.finditer(text):
        for i in range(3):
            counts[i] += int(m.group(i + 1))
    if not TEST_RESULT.search(text):
        return {}
    return {"tests": dict(zip(("passed", "failed", "ignored"), counts))}


def read_figures(file):
    """Each line of the section's figures file is a JSON object; later keys win."""
    figures = {}
    if file and os.path.exists(file):
        with open(file) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        figures.update(json.loads(line))
                    except (json.JSONDecodeError, TypeError, ValueError):
                        figures.setdefault("unparsed", []).append(line[:300])
    return figures


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cmd", choices=["start", "begin", "end", "finish"])
    p.add_argument("--out", required=True)
    p.add_argument("--mode")
    p.add_argument("--deadline", type=int)
    p.add_argument("--elapsed", type=int, default=0)
    p.add_argument("--manifest")
    p.add_argument("--name")
    p.add_argument("--limit", type=int)
    p.add_argument("--verdict")
    p.add_argument("--seconds", type=int)
    p.add_argument("--log")
    p.add_argument("--figures")
    a = p.parse_args()
    if a.cmd == "start":
        # The deadline counts from the script's start, before the summary's.
        s = {"mode": a.mode, "deadline_s": a.deadline,
             "started_unix": int(time.time()) - a.elapsed, "elapsed_s": a.elapsed,
             "finished": False, "running": None, "sections": []}
        if a.manifest and os.path.exists(a.manifest):
            with open(a.manifest) as f:
                s["pack"] = json.load(f)
        save(a.out, s)
        return
    s = load(a.out)
    s["elapsed_s"] = elapsed(s)
    if a.cmd == "begin":
        s["running"] = {"name": a.name, "limit": a.limit, "started_s": s["elapsed_s"]}
    elif a.cmd == "end":
        text = ""
        if a.log and os.path.exists(a.log):
            with open(a.log, errors="replace") as f:
                text = ANSI.sub("", f.read())
        figures = figures_from_log(text)
        figures.update(read_figures(a.figures))
        tail = [l[:300] for l in text.rstrip("\n").splitlines()[-TAIL_LINES:]]
        s["sections"].append({"name": a.name, "verdict": a.verdict, "seconds": a.seconds,
                              "limit": a.limit, "figures": figures, "tail": tail})
        s["running"] = None
    else:
        s["finished"] = True
    save(a.out, s)
    if a.cmd == "finish":
        with open(os.path.join(a.out, "summary.txt")) as f:
            print(f.read(), end="")
        words = [x["verdict"].split()[0] for x in s["sections"]]
        print(f"gpu-check: {words.count('PASS')} passed, "
              f"{words.count('FAIL') + words.count('NOT')} failed, {words.count('SKIP')} skipped")


if __name__ == "__main__":
    main()
