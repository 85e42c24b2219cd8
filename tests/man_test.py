#!/usr/bin/env python3
"""The man pages as a reader gets them: tierkvd(8) and tierkv(1), made by
scripts/md2man.py from docs/tierkvd.md and docs/cli.md.

For each PAGE BINARY pair: the page renders without a warning (groff -man
-Tutf8 -ww, when groff is installed; else a structural check of the roff: .TH
first, NAME and at least two other .SH sections, no raw Markdown fences or
table rows left), `man -l` shows it (when man is installed), and every flag
that `BINARY --help` prints (each --word) appears in the rendered text (or,
without groff, in the roff with its \\- unescaped). A flag --help shows but
the doc lacks fails the test: document the flag in the .md.

usage: man_test.py PAGE BINARY [PAGE BINARY]...
"""
import os
import re
import shutil
import subprocess
import sys


def render(page):
    """The page as text, or None without groff; raises on a warning."""
    if shutil.which("groff") is None:
        return None
    p = subprocess.run(["groff", "-man", "-Tutf8", "-ww", page], capture_output=True,
                       text=True, env=dict(os.environ, GROFF_NO_SGR="1"))
    if p.returncode != 0 or p.stderr.strip():
        raise SystemExit("man: FAIL: groff on %s: exit %d: %s" % (page, p.returncode, p.stderr))
    text = re.sub(r".\x08", "", p.stdout)  # overstrike bold and underline
    return text.replace("\u2212", "-").replace("\u2010", "-")


def structure(page, roff):
    bad = []
    lines = roff.split("\n")
    if not lines[0].startswith(".TH "):
        bad.append("the first line is not .TH")
    sh = [l for l in lines if l.startswith(".SH ")]
    if ".SH NAME" not in sh or len(sh) < 3:
        bad.append("sections %r: want NAME and two more" % sh)
    if any(l.startswith("```") or l.startswith("|") for l in lines):
        bad.append("raw Markdown (a fence or a table row) left")
    return bad


def main(argv):
    if len(argv) < 2 or len(argv) % 2:
        print(__doc__)
        return 2
    fails = 0
    for page, binary in zip(argv[0::2], argv[1::2]):
        with open(page, encoding="ascii") as f:  # md2man writes ASCII only
            roff = f.read()
        bad = structure(page, roff)
        text = render(page)
        how = "groff -man -Tutf8 -ww"
        if text is None:
            text = roff.replace("\\-", "-")
            how = "the roff (no groff)"
        if shutil.which("man") is not None:
            p = subprocess.run(["man", "-l", page], capture_output=True, text=True,
                               env=dict(os.environ, MANPAGER="cat", PAGER="cat",
                                        MANWIDTH="80"))
            if p.returncode != 0 or "NAME" not in p.stdout:
                bad.append("man -l: exit %d: %s" % (p.returncode, p.stderr.strip()))
        helptext = subprocess.run([binary, "--help"], capture_output=True, text=True,
                                  timeout=30).stdout
        flags = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", helptext)))
        if len(flags) < 5:
            bad.append("%s --help printed only %d flags" % (binary, len(flags)))
        words = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", text))
        missing = [fl for fl in flags if fl not in words]
        if missing:
            bad.append("flags %s --help prints but the page lacks: %s"
                       % (os.path.basename(binary), " ".join(missing)))
        name = os.path.basename(page)
        if bad:
            fails += 1
            print("man: FAIL: %s: %s" % (name, "; ".join(bad)))
        else:
            print("man: ok: %s renders (%s, %d lines) and lists all %d flags of %s --help"
                  % (name, how, text.count("\n"), len(flags), os.path.basename(binary)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
