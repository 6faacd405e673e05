#!/usr/bin/env python3
"""Import loops between sibling files of src/ (and python/src/): a file that names another file of
its folder (`use super::x`, `super::x::f(...)`, `crate::a::x::...`) while that file names it back,
directly or round a longer cycle. A module's mod.rs and its children are left out: the parent
declares and re-exports its children by design. Prints each loop and exits 1 if there is one.

Usage: python3 tools/import_loops.py [ROOT]   (ROOT: the repository, default: this script's)
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1])
# Paths in code: `crate::a::b`, `super::b`, `super::super::b` (comments are stripped first).
PATH = re.compile(r"\b(crate|super(?:::super)*|self)::([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)")
# `use super::{a, b::C}` groups: the names right after the opening brace or a comma.
GROUP = re.compile(r"\b(crate|super(?:::super)*|self)::((?:[A-Za-z_][A-Za-z0-9_]*::)*)\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")


def module_path(crate_src, file):
    """The module path of `file` inside the crate whose root folder is `crate_src`."""
    parts = list(file.relative_to(crate_src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def strip(text):
    """The code without its comments (strings are kept: a path inside one is rare, and a char
    literal such as '"' would throw a string matcher off)."""
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def referenced_paths(text, here):
    """Absolute module paths (lists of names) this file's code names."""
    out = []

    def absolute(head, rest):
        if head == "crate":
            base = []
        elif head == "self":
            base = list(here)
        else:
            ups = head.count("super")
            base = list(here[: len(here) - ups]) if ups <= len(here) else []
        return base + [p for p in rest.split("::") if p]

    for m in PATH.finditer(text):
        out.append(absolute(m.group(1), m.group(2)))
    for m in GROUP.finditer(text):
        prefix = absolute(m.group(1), m.group(2))
        for item in re.split(r",", m.group(3)):
            name = item.strip().split("::")[0].strip("{} ")
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name or ""):
                out.append(prefix + [name])
    return out


def loops(crate_src):
    files = sorted(crate_src.rglob("*.rs"))
    by_path = {tuple(module_path(crate_src, f)): f for f in files}
    here_of = {f: module_path(crate_src, f) for f in files}
    # The folder module a file declares, if it is a mod.rs (its children are exempt from it).
    edges = {f: set() for f in files}
    for f in files:
        here = here_of[f]
        # A non-mod file's own module path is `here`; its siblings share here[:-1].
        for path in referenced_paths(strip(f.read_text()), here):
            # The longest prefix of the path that is a file of the crate.
            for n in range(len(path), 0, -1):
                target = by_path.get(tuple(path[:n]))
                if target is not None:
                    break
            else:
                continue
            if target == f:
                continue
            a, b = here_of[f], here_of[target]
            siblings = f.name != "mod.rs" and target.name != "mod.rs" and a[:-1] == b[:-1] and f.parent == target.parent
            if siblings:
                edges[f].add(target)
    # Cycles: strongly connected components of more than one file (Tarjan).
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in files:
        if v not in index:
            visit(v)
    return comps


def main():
    found = []
    for crate_src in (ROOT / "src", ROOT / "python" / "src"):
        if crate_src.is_dir():
            found += loops(crate_src)
    for comp in found:
        print("import loop: " + " <-> ".join(str(f.relative_to(ROOT)) for f in comp))
    print(f"{len(found)} import loop(s) between sibling files")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
