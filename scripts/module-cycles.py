#!/usr/bin/env python3
"""Prints the import cycles between the top-level modules of a crate: an edge A -> B for
every `crate::B` a file of module A names (a `use` line or a path in code; comments,
`tests.rs` files and everything after a file's first `#[cfg(test)]` skipped), then the strongly connected components with more than one module. Usage:
scripts/module-cycles.py <crate src dir> (e.g. src, ottla-proto/src)."""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "src"
edges = {}
mods = set()
for dirpath, _, files in os.walk(root):
    for f in files:
        if not f.endswith(".rs"):
            continue
        path = os.path.join(dirpath, f)
        rel = os.path.relpath(path, root)
        top = rel.split(os.sep)[0]
        top = top[:-3] if top.endswith(".rs") else top
        if top in ("lib", "main", "mod") or f == "tests.rs":
            continue
        mods.add(top)
        for line in open(path, encoding="utf-8"):
            if line.strip().startswith("#[cfg(test)]"):
                break
            code = line.split("//")[0]
            for m in re.finditer(r"\bcrate::([a-z_][a-z_0-9]*)", code):
                edges.setdefault(top, set()).add(m.group(1))
            # `use crate::{a, b::c}` groups
            g = re.search(r"\bcrate::\{([^}]*)\}", code)
            if g:
                for name in re.findall(r"(?:^|,)\s*([a-z_][a-z_0-9]*)", g.group(1)):
                    edges.setdefault(top, set()).add(name)
graph = {m: {t for t in edges.get(m, ()) if t in mods and t != m} for m in mods}

index, low, stack, on, sccs = {}, {}, [], set(), []
counter = [0]


def strong(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(graph[v]):
        if w not in index:
            strong(w)
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
        sccs.append(sorted(comp))


for v in sorted(mods):
    if v not in index:
        strong(v)
cycles = [c for c in sccs if len(c) > 1]
print(f"{root}: {len(mods)} top-level modules, {sum(len(v) for v in graph.values())} edges")
for c in cycles:
    inner = sorted((a, b) for a in c for b in graph[a] if b in c)
    print("cycle: " + ", ".join(c))
    print("  edges: " + ", ".join(f"{a}->{b}" for a, b in inner))
if not cycles:
    print("no cycles")
