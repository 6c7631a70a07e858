#!/usr/bin/env python3
"""The import graph of a crate's modules, from its `use crate::...` lines, and its cycles.

    python scripts/import_cycles.py [engine]      # prints each cycle, then every edge

A node is a top-level module of `<crate>/src` (for `models`, one node per family module).
Test modules (`#[cfg(test)]` onwards) and comments do not count. Exit status 1 when there is a cycle.
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def node(parts):
    if not parts:
        return "lib"
    if parts[0] == "models" and len(parts) > 1:
        return "models::" + parts[1]
    return parts[0]


def graph(crate):
    src = os.path.join(ROOT, crate, "src")
    edges = defaultdict(set)
    for folder, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(folder, name)
            parts = os.path.relpath(path, src)[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            here = node(parts)
            text = open(path, encoding="utf-8").read().split("#[cfg(test)]")[0]
            # Comments (doc links included) are not imports.
            text = re.sub(r"//[^\n]*", "", text)
            for top, sub in re.findall(r"crate::([a-z_0-9]+)(?:::([a-z_0-9]+))?", text):
                there = node([top, sub] if sub else [top])
                if there != here:
                    edges[here].add(there)
    return edges


def cycles(edges):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def main():
    crate = sys.argv[1] if len(sys.argv) > 1 else "engine"
    edges = graph(crate)
    found = cycles(edges)
    for c in found:
        print("cycle:", " ".join(c))
    for k in sorted(edges):
        print(f"{k} -> {' '.join(sorted(edges[k]))}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
