#!/usr/bin/env python3
"""Prints the provider's module graph (which module names which) and its
import cycles; with --check, exits 1 if there is any cycle."""
import os, re, sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "provider", "src")
mods = {}
for dirpath, _, files in os.walk(root):
    for f in files:
        if not f.endswith(".rs") or "bin" in os.path.relpath(dirpath, root).split(os.sep):
            continue
        rel = os.path.relpath(os.path.join(dirpath, f), root)
        name = rel[:-3].replace(os.sep, "::")
        if name.endswith("::mod"):
            name = name[:-5]
        if name == "lib":
            continue
        top = name.split("::")[0]
        mods.setdefault(top, set())
        text = open(os.path.join(dirpath, f)).read()
        text = re.sub(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", "", text, flags=re.S)
        for m in re.finditer(r"crate::(\w+)", text):
            mods[top].add(m.group(1))
        for m in re.finditer(r"use crate::\{([^}]*)\}", text):
            for part in m.group(1).split(","):
                part = part.strip().split("::")[0]
                if part:
                    mods[top].add(part)
graph = {m: sorted(d for d in deps if d in mods and d != m) for m, deps in mods.items()}

# Strongly connected components (Tarjan).
index, low, stack, on, sccs = {}, {}, [], set(), []
def visit(v, counter=[0]):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in graph[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        sccs.append(sorted(comp))
sys.setrecursionlimit(10000)
for v in sorted(graph):
    if v not in index:
        visit(v)
cycles = [c for c in sccs if len(c) > 1]
for m in sorted(graph):
    print(f"{m:10} -> {' '.join(graph[m])}")
for c in cycles:
    print("cycle:", " ".join(c))
print(f"modules: {len(graph)}, cycles: {len(cycles)}")
if "--check" in sys.argv and cycles:
    sys.exit(1)
