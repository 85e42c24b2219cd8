#!/usr/bin/env python3
"""The structure rules of issue 14, checked rather than hoped for.

1. No library function is longer than LIMIT lines (80) unless the comment just
   above it says why, with a line that starts "Long:" inside that comment.
2. No two library files call each other: for every pair of object files A and
   B under the given object roots, A may use B's symbols or B may use A's, not
   both. The call graph comes from `nm` on the objects meson built.

Usage: structure_check.py [--limit N] --src DIR... [--objs DIR...]
Exits 1 and names each offence; 0 when the tree keeps both rules."""
import argparse
import glob
import os
import re
import subprocess
import sys


def functions(path):
    """(name, first body line, body lines, comment above) for each function
    whose braces stand alone at column 0 (.clang-format puts them there)."""
    lines = open(path, errors="replace").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i] != "{":
            i += 1
            continue
        j = i - 1
        sig = []
        while j >= 0 and lines[j].strip() and not lines[j].startswith(("}", "#", "/*", " *")):
            sig.insert(0, lines[j])
            j -= 1
        comment = []
        while j >= 0 and (lines[j].startswith(("/*", " *")) or lines[j].endswith("*/")):
            comment.insert(0, lines[j])
            j -= 1
        m = re.search(r"(\w+)\s*\(", " ".join(sig))
        k = i + 1
        while k < len(lines) and lines[k] != "}":
            k += 1
        if m:
            yield m.group(1), i + 1, k - i - 1, "\n".join(comment)
        i = k + 1


def long_functions(dirs, limit):
    bad = []
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*.c"))):
            for name, line, n, comment in functions(path):
                if n > limit and not re.search(r"^\s*(/?\*)?\s*Long:", comment, re.M):
                    bad.append(f"{path}:{line}: {name} is {n} lines (limit {limit}; "
                               "a comment line 'Long: why' above it allows more)")
    return bad


def symbols(obj):
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "TDBRC":
            defined.add(f[2])
        elif len(f) == 2 and f[0] == "U":
            used.add(f[1])
    return defined, used


def mutual_calls(roots):
    objs = sorted(o for r in roots for o in glob.glob(os.path.join(r, "**", "*.a.p", "*.o"),
                                                      recursive=True))
    owner, uses = {}, {}
    for o in objs:
        defined, used = symbols(o)
        uses[o] = used
        for s in defined:
            owner[s] = o
    edges = {o: {owner[s] for s in u if s in owner and owner[s] != o} for o, u in uses.items()}
    name = lambda o: os.path.basename(o)[: -len(".o")]
    bad = []
    for a in objs:
        for b in sorted(edges[a]):
            if a < b and a in edges.get(b, ()):
                bad.append(f"{name(a)} and {name(b)} call each other")
    return bad, len(objs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--src", nargs="+", required=True)
    ap.add_argument("--objs", nargs="*", default=[])
    a = ap.parse_args()
    bad = long_functions(a.src, a.limit)
    nobj = 0
    if a.objs:
        more, nobj = mutual_calls(a.objs)
        if nobj == 0:
            bad.append("no object files found under " + " ".join(a.objs))
        bad += more
    for b in bad:
        print("structure:", b)
    print(f"structure: {len(a.src)} source dirs, {nobj} objects, {len(bad)} offences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
