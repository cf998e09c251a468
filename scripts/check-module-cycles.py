#!/usr/bin/env python3
"""Fails if execbox's modules import each other in a cycle.

The graph has one node per source file under src/ (a module). An edge
A -> B means A names an item through a path that resolves (syntactically) to
module B: `use crate::x::y::Item`, `super::z::Item`, `crate::x::f(...)` in
code. A path resolves to the deepest module it names, so importing through a
re-export (`crate::Language`, `super::Container` re-exported by a parent)
counts as depending on the module that re-exports it: import from the
module that defines the item. Comments, strings and `#[cfg(test)] mod
tests` blocks are ignored; the binaries (src/bin, and the CLI under cli/)
are separate crates.

The same check runs again at the folder level: each module counts as the
top-level module it sits under (`tools::bridge` as `tools`, `backends::boa::
contained` as `backends`), so the crate's layers (the contract at the
bottom, mechanisms, the door, engines and tools, then serve, agent and the
CLI) cannot point at each other in a circle either. `--files-only` skips it.

Usage: scripts/check-module-cycles.py [--graph] [--files-only]   (exit 1 on a cycle)
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_files():
    """Maps module paths (tuples) to files."""
    mods = {}
    for dirpath, _, files in os.walk(ROOT):
        rel = os.path.relpath(dirpath, ROOT)
        if rel.startswith("bin"):
            continue
        parts = () if rel == "." else tuple(rel.split(os.sep))
        for f in files:
            if not f.endswith(".rs"):
                continue
            if f in ("lib.rs", "mod.rs"):
                mods[parts] = os.path.join(dirpath, f)
            else:
                mods[parts + (f[:-3],)] = os.path.join(dirpath, f)
    return mods


def strip(text):
    """Drops comments, string and char literals, and the test module."""
    cut = re.search(r"#\[cfg\(test\)\]\s*(pub(\(\w+\))?\s+)?mod\s+tests\s*\{", text)
    if cut:
        text = text[: cut.start()]
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "r" and re.match(r'r#*"', text[i:]):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            i = n if end < 0 else end + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", text[i:]).group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_use(body):
    """`a::{b, c::{d}}` -> ['a::b', 'a::c::d']."""
    body = re.sub(r"\s+", "", body)
    results = []

    def walk(prefix, s):
        if not s.startswith("{"):
            results.append(prefix + s)
            return
        depth, start, items = 0, 1, []
        for k, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    items.append(s[start:k])
            elif ch == "," and depth == 1:
                items.append(s[start:k])
                start = k + 1
        for item in items:
            if not item:
                continue
            m = re.match(r"^((?:[\w]+::)*)(\{.*\})$", item)
            if m:
                walk(prefix + m.group(1), m.group(2))
            else:
                results.append(prefix + item)

    m = re.match(r"^((?:[\w]+::)*)(\{.*\})$", body)
    if m:
        walk(m.group(1), m.group(2))
    else:
        results.append(body)
    return results


def paths_in(code, children):
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        paths += expand_use(m.group(1))
    code_wo_use = re.sub(r"\buse\s+[^;]+;", "", code)
    paths += re.findall(r"\b(?:crate|super|self)(?:::\w+)+", code_wo_use)
    # Paths relative to this module: a child module's name, not after `::`.
    for child in children:
        paths += ["self::" + m for m in re.findall(r"(?<![:\w])(" + child + r"(?:::\w+)+)", code_wo_use)]
    return paths


def resolve(path, here, mods):
    parts = [p for p in re.split(r"::", path.split(" as ")[0]) if p]
    if not parts:
        return None
    if parts[0] == "crate":
        base, rest = (), parts[1:]
    elif parts[0] in ("super", "self"):
        base = here
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                base = base[:-1]
            parts = parts[1:]
        rest = parts
    elif here + (parts[0],) in mods:
        base, rest = here, parts
    else:
        return None
    target = base
    for p in rest:
        if target + (p,) in mods:
            target = target + (p,)
        else:
            break
    return target if target != here else None


def cycles(graph):
    """Strongly connected components of `graph` with more than one node."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
            if len(comp) > 1:
                out.append(comp)

    for v in graph:
        if v not in index:
            strong(v)
    return out


def report(graph, found, name):
    for comp in found:
        members = sorted(comp)
        print("cycle among:", ", ".join(name(m) for m in members))
        for m in members:
            inside = sorted(t for t in graph[m] if t in comp)
            print("   ", name(m), "->", ", ".join(name(t) for t in inside))


def main():
    mods = module_files()
    graph = {m: set() for m in mods}
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            code = strip(f.read())
        children = [m[-1] for m in mods if len(m) == len(mod) + 1 and m[: len(mod)] == mod]
        for p in paths_in(code, children):
            target = resolve(p, mod, mods)
            if target is not None and target in mods:
                graph[mod].add(target)
    if "--graph" in sys.argv:
        for m in sorted(graph):
            print("::".join(m) or "crate", "->", ", ".join(sorted("::".join(t) or "crate" for t in graph[m])))
    name = lambda m: "::".join(m) or "crate (lib.rs)"
    failed = False
    found = cycles(graph)
    if found:
        report(graph, found, name)
        failed = True
    else:
        print(f"no import cycles among {len(mods)} modules")
    if "--files-only" not in sys.argv:
        # The folder level: each module as the top-level module it sits under.
        top = lambda m: m[:1]
        folders = {top(m): set() for m in mods if m}
        for m, targets in graph.items():
            if not m:
                continue
            folders[top(m)].update(top(t) for t in targets if t and top(t) != top(m))
        found = cycles(folders)
        if found:
            print("folder-level cycles (each module counted as its top-level module):")
            report(folders, found, name)
            failed = True
        else:
            print(f"no import cycles among {len(folders)} top-level modules")
    if failed:
        sys.exit(1)


main()
