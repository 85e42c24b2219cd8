#!/usr/bin/env python3
"""The structure rules of issue 14, checked rather than hoped for.

1. No library function is longer than LIMIT lines (80) unless the comment just
   above it says why, with a line that starts "Long:" inside that comment.
2. No two library files call each other: for every pair of object files A and
   B under the given object roots, A may use B's symbols or B may use A's, not
   both. The call graph comes from `nm` on the objects meson built.
3. Each small helper has one home (issue 52): byte order (base/endian.h),
   base64 (base/base64.c), clock readers (base/clock.h) and host:port
   splitting live in base/, role names in raft/ (raft_role_name). A function
   defined anywhere else under the --helpers roots (recursively, .c and .h,
   fixtures/ skipped)
   that looks like one of them is an offence, unless KNOWN_COPIES names it
   with the reason it stays; a KNOWN_COPIES entry that no longer matches is an
   offence too, so the list only shrinks.
4. The docs' call lists are true (issue 52 item 7). A table row of --calls-doc
   whose first cell is a file (`name.c`) lists its calls when the table's
   second column is "calls", or from the word "Calls " on in a row of any
   other table. Each bare `x.c` there (outside parentheses, which hold notes)
   is a file of the row's own module; the module is the --objs root whose
   name (its directory's) the nearest heading above names. The files of that
   module the row's object uses symbols of (nm) must be exactly those listed:
   a call the row omits or one it invents is an offence. A `mod/x.c` names
   another module's file, which the object must use too (the list need not
   name every other module). Each object of a --calls-complete module needs a
   row; other modules' objects without one are only noted.
5. The node fence (issue 52 item 1): each sub-struct of struct node is
   written by one file, its owner, named in --fence-doc's table whose header
   starts "| sub-struct | owner |". A row's first cell is a member of struct
   node (`loop`) or a part of one (`m.metrics`: the longest row that
   matches an access decides); its owner is a file (`node_tier.c`) or
   "shared", an exemption whose row says why. Every member of struct node
   (in --fence-header) that is a struct needs a row, and every row's member
   must exist. A write is `n->SUB...` assigned (`=`, `+=`, ...), `++`/`--`
   on it, its address handed to an atomic write (`atomic_store`,
   `atomic_fetch_*`, `atomic_exchange`, ...), memset or memcpy's
   destination, a request list handed to node__list_pop, node__list_push
   or node__fail_list, or its address kept in a pointer that is not const
   (`struct x *p = &n->SUB`). Its address handed to any other function
   (uv_*, kv_*) is not followed: that is not checked. The writes are
   looked for in each .c of --fence-src (directories, or files) that
   includes node_internal.h and in
   the header's inline functions, each counted as the file its
   `/* ---- x.c ---- */` section names (none: the header itself, which owns
   nothing). A write from another file than the owner is an offence.

Usage: structure_check.py [--limit N] --src DIR... [--objs DIR...]
                          [--helpers DIR...]
                          [--calls-doc FILE [--calls-complete MOD...]]
                          [--fence-doc FILE --fence-header FILE
                           --fence-src DIR|FILE...]
Exits 1 and names each offence; 0 when the tree keeps every rule."""
import argparse
import glob
import os
import re
import subprocess
import sys


def scan(path):
    """(name, first body line, signature, body lines, comment above) for each
    function whose braces stand alone at column 0 (.clang-format puts them
    there)."""
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
            yield m.group(1), i + 1, " ".join(sig), lines[i + 1:k], "\n".join(comment)
        i = k + 1


def functions(path):
    """(name, first body line, body lines, comment above) of each function."""
    for name, line, _, body, comment in scan(path):
        yield name, line, len(body), comment


# What a private copy of a base/ (or raft/) helper looks like: (kind, home
# directory, test on (name, signature, body)).
BYTES_PARAM = re.compile(r"\(\s*(const\s+)?(uint8_t|unsigned char|void)\s*\*")
HELPER_KINDS = [
    ("byte order", "base",
     lambda n, sig, body: re.search(
         r"(^|_)(put|get|rd|wr|load|store|read|write)_?(be|le|u)?(16|32|64)$|^(be|le)(16|32|64)$",
         n) is not None and BYTES_PARAM.search(sig) is not None),
    ("base64", "base",
     lambda n, sig, body: re.search(r"(base64|b64).*(enc|dec|len|max)", n) is not None),
    ("clock reader", "base",
     lambda n, sig, body: "clock_gettime(" in body and len(body.split("\n")) <= 6),
    ("host:port splitter", "base",
     lambda n, sig, body: re.search(r"hostport|host_port|split_addr", n) is not None),
    ("role names", "raft",
     lambda n, sig, body: '"candidate"' in body and ('"leader"' in body or '"follower"' in body)),
]

# Copies that stay for now, each with its reason. Keyed by path relative to a
# --helpers root's parent (the source root) and function name.
KNOWN_COPIES = {
    ("cmd/tierkv/args.c", "parse_hostport_n"):
        "an endpoint: http[s]:// and a path accepted, the port kept as text",
    ("cmd/tierkv/args.c", "cli_parse_hostport"): "the public face of parse_hostport_n",
    ("cmd/raft-perf-probe/main.c", "now_s"): "seconds as a double for rates",
    ("cmd/raft-perf-probe/main.c", "process_cpu_s"): "the whole process's CPU time",
    ("tests/sim/main.c", "wall_s"): "seconds as a double for the sweep's report",
    ("tests/unit/kv/snap_check_bench.c", "clock_ms"): "takes the clock id to compare two",
    ("tests/unit/node/node_turn_test.c", "clock_ns"): "takes the clock id to compare two",
    ("tests/unit/store/store_crash_test.c", "now_s"): "seconds as a double for the report",
}


def definitions(path):
    """(name, line, signature, body) of each function."""
    for name, line, sig, body, _ in scan(path):
        yield name, line, sig, "\n".join(body)


def helper_copies(roots):
    bad, seen = [], set()
    for root in roots:
        top = os.path.dirname(os.path.normpath(root))
        for dirpath, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "fixtures")  # planted copies
            for fn in sorted(names):
                if not fn.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, top)
                home_dir = rel.split(os.sep)[0]
                for name, line, sig, body in definitions(path):
                    for kind, home, looks in HELPER_KINDS:
                        if home_dir == home or not looks(name, sig, body):
                            continue
                        if (rel, name) in KNOWN_COPIES:
                            seen.add((rel, name))
                            continue
                        bad.append(f"{path}:{line}: {name} is a second {kind} helper "
                                   f"(the one copy lives in {home}/)")
    for key, why in KNOWN_COPIES.items():
        if key not in seen and any(
                os.path.exists(os.path.join(os.path.dirname(os.path.normpath(r)), key[0]))
                for r in roots):
            bad.append(f"{key[0]}: KNOWN_COPIES names {key[1]}, which is gone: drop the entry")
    return bad


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


def module_objects(roots):
    """{module: {file.c: object path}} for each --objs root, the module named
    by the root's directory."""
    mods = {}
    for r in roots:
        objs = glob.glob(os.path.join(r, "**", "*.a.p", "*.o"), recursive=True)
        mods[os.path.basename(os.path.normpath(r))] = {
            os.path.basename(o)[: -len(".o")]: o for o in sorted(objs)}
    return mods


def drop_parens(text):
    """text without its parenthesised notes (nested ones too)."""
    out, depth = [], 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")" and depth > 0:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def call_rows(doc, modules):
    """(line, module or None, file, listed same-module files, listed other
    modules' files) for each row of doc that lists a file's calls."""
    rows, heading, header = [], "", None
    for n, line in enumerate(open(doc, errors="replace").read().split("\n"), 1):
        if line.startswith("#"):
            heading = line
        if not line.startswith("|"):
            header = None
            continue
        c = cells(line)
        if header is None:
            header = [h.lower() for h in c]
            continue
        m = re.fullmatch(r"`?([\w.-]+\.c)`?", c[0])
        if not m or set("".join(c)) <= set("-: "):
            continue
        rest = " | ".join(c[1:])
        if len(header) > 1 and header[1] == "calls":
            listed = rest
        elif "Calls " in rest:
            listed = rest[rest.rindex("Calls ") + len("Calls "):]
        else:
            continue
        listed = drop_parens(listed).replace("`", "")
        same = set(re.findall(r"(?<![\w/.-])([\w-]+\.c)\b", listed))
        other = set(re.findall(r"\b([\w-]+/[\w-]+\.c)\b", listed))
        mod = next((k for k in sorted(modules, key=len, reverse=True)
                    if re.search(r"\b%s\b" % re.escape(k), heading)), None)
        rows.append((n, mod, m.group(1), same, other))
    return rows


def doc_calls(doc, roots, complete):
    """Offences and notes of rule 4."""
    modules = module_objects(roots)
    uses, owner, local = {}, {}, {}
    for mod, objs in modules.items():
        for f, o in objs.items():
            defined, used = symbols(o)
            uses[(mod, f)] = used
            for s in defined:
                owner[s] = (mod, f)
                local[(mod, s)] = f
    bad, notes, documented = [], [], set()
    for n, mod, f, same, other in call_rows(doc, modules):
        where = f"{doc}:{n}"
        if mod is None:
            bad.append(f"{where}: the row for {f} is under a heading that names no "
                       f"module of {sorted(modules)}")
            continue
        if f not in modules[mod]:
            bad.append(f"{where}: the row for {f} names no object of {mod}/")
            continue
        documented.add((mod, f))
        called = {(mod, local[(mod, s)]) if (mod, s) in local else owner[s]
                  for s in uses[(mod, f)] if (mod, s) in local or s in owner} - {(mod, f)}
        real = {g for m2, g in called if m2 == mod}
        for g in sorted(real - same):
            bad.append(f"{where}: {mod}/{f} calls {g}, which its row omits")
        for g in sorted(same - real):
            why = "" if g in modules[mod] else f" ({g} is no object of {mod}/)"
            bad.append(f"{where}: {mod}/{f}'s row lists {g}, which it does not call{why}")
        for g in sorted(other):
            m2, g2 = g.split("/")
            if m2 in modules and (m2, g2) not in called:
                bad.append(f"{where}: {mod}/{f}'s row lists {g}, which it does not call")
    for mod in sorted({m for m, _ in documented} | set(complete)):
        for f in sorted(modules.get(mod, {})):
            if (mod, f) in documented:
                continue
            msg = f"{mod}/{f} has no row listing its calls in {doc}"
            (bad if mod in complete else notes).append(msg)
    for mod in complete:
        if not modules.get(mod):
            bad.append(f"--calls-complete names {mod}, which has no objects under --objs")
    return bad, notes


# Rule 5: the node fence.
FENCE_CHAIN = r"(?:\s*(?:\.|->)\s*\w+|\s*\[[^\]\[]*(?:\[[^\]]*\][^\]\[]*)*\])*"
FENCE_ACCESS = re.compile(r"(?P<pre>\+\+|--)?\s*\bn->(?P<sub>\w+)(?P<chain>" + FENCE_CHAIN +
                          r")\s*(?P<op>(?:<<|>>|[-+*/%&|^])?=(?!=)|\+\+|--)?")
FENCE_ADDR = re.compile(r"\b(?P<fn>atomic_(?:store|fetch_\w+|exchange|compare_exchange_\w+|init)"
                        r"(?:_explicit)?|memset|memcpy)\s*\(\s*&\s*n->(?P<sub>\w+)"
                        r"(?P<chain>" + FENCE_CHAIN + r")")
# The request lists change only through these (node_reqs.h, node_status.c):
# a list of n->SUB handed to one, as any argument, is written.
FENCE_LIST = re.compile(r"\b(?P<fn>node__list_pop|node__list_push|node__fail_list)\s*\("
                        r"(?:[^;()]*,)?\s*&\s*n->(?P<sub>\w+)(?P<chain>" + FENCE_CHAIN + r")")
FENCE_ALIAS = re.compile(r"(?:^|[;({])\s*(?P<const>const\s+)?(?:(?:struct|union)\s+)?\w+"
                         r"\s*\*+\s*\w+\s*=\s*&\s*n->(?P<sub>\w+)(?P<chain>" + FENCE_CHAIN + r")",
                         re.M)
FENCE_SECTION = re.compile(r"/\* ---- (.*?) ---- \*/")


def blank_comments(text):
    """text with its comments, strings and character literals blanked (lines
    kept)."""
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                  lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def fence_table(doc):
    """{dotted member: (owner, line)} from the doc's sub-struct table."""
    rows, header = {}, None
    for n, line in enumerate(open(doc, errors="replace").read().split("\n"), 1):
        if not line.startswith("|"):
            header = None
            continue
        c = cells(line)
        if header is None:
            header = [h.lower() for h in c]
            continue
        if header[:2] != ["sub-struct", "owner"] or set("".join(c)) <= set("-: "):
            continue
        for key in re.findall(r"`([\w.]+)`", c[0]):
            rows[key] = (c[1].replace("`", "").strip(), n)
    return rows


def struct_members(header):
    """The members of struct node that are structs (or arrays of them)."""
    text = blank_comments(open(header, errors="replace").read())
    m = re.search(r"^struct node \{\n(.*?)^\};", text, re.M | re.S)
    if not m:
        return None
    body, out, depth = m.group(1), set(), 0
    for line in body.split("\n"):
        s = line.strip()
        if depth == 0:
            d = re.match(r"struct\s+\w+\s+(\w+)\s*(\[[^\]]*\])?\s*;", s)
            if d:
                out.add(d.group(1))
        if s.startswith("}") and depth == 1:
            d = re.match(r"\}\s*(\w+)\s*(\[[^\]]*\])?\s*;", s)
            if d:
                out.add(d.group(1))
        depth += s.count("{") - s.count("}")
    return out


def fence_writes(path, text, default_owner):
    """(line, writer file, dotted path written) of each write to n->SUB in
    text; in a header, each section's writer is the file it names."""
    code = blank_comments(text)
    sections = [] if default_owner else [
        (m.start(), (re.findall(r"\b([\w-]+\.c)\b", m.group(1)) or [None])[0])
        for m in FENCE_SECTION.finditer(text)]

    def writer(pos):
        w = default_owner
        for start, f in sections:
            if start <= pos:
                w = f
        return w

    def dotted(sub, chain):
        return ".".join([sub] + re.findall(r"(?:\.|->)\s*(\w+)", re.sub(r"\[.*?\]", "", chain)))

    found = []
    for m in FENCE_ACCESS.finditer(code):
        if m.group("pre") or m.group("op"):
            found.append((code.count("\n", 0, m.start("sub")) + 1, writer(m.start("sub")),
                          dotted(m.group("sub"), m.group("chain"))))
    for m in list(FENCE_ADDR.finditer(code)) + list(FENCE_LIST.finditer(code)):
        found.append((code.count("\n", 0, m.start()) + 1, writer(m.start()),
                      dotted(m.group("sub"), m.group("chain")) + f" (by {m.group('fn')})"))
    for m in FENCE_ALIAS.finditer(code):
        if m.group("const"):
            continue
        found.append((code.count("\n", 0, m.start("sub")) + 1, writer(m.start("sub")),
                      dotted(m.group("sub"), m.group("chain")) + " (through a pointer that "
                      "is not const)"))
    return found


def node_fence(doc, header, srcs):
    """Offences of rule 5; srcs: directories (their .c files) or .c files."""
    files = []
    for src in srcs:
        if os.path.isdir(src):
            files += [(os.path.join(src, f), f) for f in sorted(os.listdir(src))
                      if f.endswith(".c")]
        else:
            files.append((src, os.path.basename(src)))
    names = {f for _, f in files}
    rows = fence_table(doc)
    members = struct_members(header)
    if members is None:
        return [f"{header}: no `struct node {{` found"]
    if not rows:
        return [f"{doc}: no table whose header starts | sub-struct | owner |"]
    bad = []
    for mem in sorted(members - {k for k in rows if "." not in k}):
        bad.append(f"{header}: struct node's {mem} has no row in {doc}'s sub-struct table "
                   "(give it an owner)")
    for key, (owner, line) in sorted(rows.items()):
        if key.split(".")[0] not in members:
            bad.append(f"{doc}:{line}: the row for {key} names no member of struct node")
        if owner != "shared" and owner not in names:
            bad.append(f"{doc}:{line}: {key}'s owner {owner} is no file of "
                       f"{' '.join(srcs)}")
    hname = os.path.basename(header)
    for path, fname in files + [(header, None)]:
        text = open(path, errors="replace").read()
        if fname is not None and not re.search(r'#include\s+"[\w/]*%s"' % re.escape(hname), text):
            continue
        for line, who, what in fence_writes(path, text, fname):
            field = what.split(" ")[0]
            key = max((k for k in rows if field == k or field.startswith(k + ".")),
                      key=len, default=None)
            if key is None:
                continue  # not a sub-struct (the handles, options): not fenced
            owner = rows[key][0]
            if owner == "shared" or owner == who:
                continue
            bad.append(f"{path}:{line}: {who or hname} writes n->{what}, which {owner} owns "
                       f"({doc}'s sub-struct table): call a function of {owner}'s (static "
                       f"inline in its section of {hname} on a hot path), or move the field "
                       f"to the struct of the file that really writes it")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--src", nargs="+", required=True)
    ap.add_argument("--objs", nargs="*", default=[])
    ap.add_argument("--helpers", nargs="*", default=[])
    ap.add_argument("--calls-doc")
    ap.add_argument("--calls-complete", nargs="*", default=[])
    ap.add_argument("--fence-doc")
    ap.add_argument("--fence-header")
    ap.add_argument("--fence-src", nargs="*", default=[])
    a = ap.parse_args()
    bad = long_functions(a.src, a.limit)
    bad += helper_copies(a.helpers)
    nobj = 0
    if a.objs:
        more, nobj = mutual_calls(a.objs)
        if nobj == 0:
            bad.append("no object files found under " + " ".join(a.objs))
        bad += more
    if a.calls_doc:
        more, notes = doc_calls(a.calls_doc, a.objs, a.calls_complete)
        bad += more
        for note in notes:
            print("structure: note:", note)
    if a.fence_doc:
        if not (a.fence_header and a.fence_src):
            ap.error("--fence-doc needs --fence-header and --fence-src")
        bad += node_fence(a.fence_doc, a.fence_header, a.fence_src)
    for b in bad:
        print("structure:", b)
    print(f"structure: {len(a.src)} source dirs, {nobj} objects, {len(bad)} offences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
