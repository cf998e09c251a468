#!/usr/bin/env python3
"""Fails when docs/architecture.md does not name a source file.

Every file under src/ and cli/src/ (*.rs), tests/ and cli/tests/ (*.rs,
*.py, *.mjs, *.json) and benches/ (*.rs) must be named in
docs/architecture.md, so the map of the tree by job stays true when files
move or appear:

- under src/ and cli/src/: its file name (`contained.rs`); a `mod.rs` or
  `lib.rs` by its folder (`boa/`, or the crate root), the CLI's `main.rs` by
  `cli/`;
- under tests/ and benches/: its file name, or its stem as a word (the
  doc lists test modules as `library/ (agent, artifacts, ...)`).

Usage: scripts/check-architecture-doc.py   (exit 1 naming what is missing)
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DOC = os.path.join(ROOT, "docs", "architecture.md")


def files(top, extensions):
    for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
        for name in sorted(names):
            if name.endswith(extensions):
                yield os.path.relpath(os.path.join(dirpath, name), ROOT)


def named(doc, path):
    name = os.path.basename(path)
    stem = name.rsplit(".", 1)[0]
    folder = os.path.basename(os.path.dirname(path))
    if path == os.path.join("cli", "src", "main.rs"):
        return "cli/" in doc
    if path.startswith("src" + os.sep) or path.startswith(os.path.join("cli", "src") + os.sep):
        if name in ("mod.rs", "lib.rs", "main.rs"):
            return path == os.path.join("src", "lib.rs") or (folder + "/") in doc
        return re.search(r"(?<![\w/.-])" + re.escape(name) + r"(?![\w.])", doc) is not None
    return name in doc or re.search(r"(?<![\w.-])" + re.escape(stem) + r"(?![\w-])", doc) is not None


def main():
    doc = open(DOC, encoding="utf-8").read()
    missing = [
        path
        for top, extensions in (
            ("src", (".rs",)),
            ("cli/src", (".rs",)),
            ("tests", (".rs", ".py", ".mjs", ".json")),
            ("cli/tests", (".rs", ".py", ".mjs", ".json")),
            ("benches", (".rs",)),
        )
        for path in files(top, extensions)
        if not named(doc, path)
    ]
    if missing:
        print("docs/architecture.md does not name:", file=sys.stderr)
        for path in missing:
            print("  " + path, file=sys.stderr)
        return 1
    print("docs/architecture.md names every file under src/, cli/, tests/ and benches/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
