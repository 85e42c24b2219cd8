#!/usr/bin/env python3
"""Our Markdown to a man page (roff, the man macros): docs/tierkvd.md ->
tierkvd.8, docs/cli.md -> tierkv.1, run by meson at build time.

It knows the subset our reference pages use, nothing more:
  # title              the page's title; "name(8)" or "name - what" / "name — what"
  ## Heading           .SH (upper-cased); "### Heading" is .SS
  paragraphs           .PP, lines joined
  ```fenced``` and 4-space indented blocks       .nf/.fi, indented
  - item / 1. item     .IP (continuation lines indented by two or more spaces)
  | a | b | tables     each row .TP: the first cell is the tag, the last cell
                       the text, the cells between appended as "(header value)"
  `code` **bold**      bold; *emphasis* italic; [text](url) is text
A page without a "## NAME" section gets one from the title, and what comes
before its first "##" heading goes under DESCRIPTION. Hyphenation is
off and every '-' is \\- so a flag is never split or turned into a hyphen.

usage: md2man.py --name NAME --section N [--date D] IN.md OUT
"""
import argparse
import re
import sys

INLINE = [
    (re.compile(r"\[([^\]]+)\]\([^)]+\)"), r"\1"),
]


def esc(text):
    """roff-escapes plain text: backslashes, dashes, and anything past ASCII
    as \\[uXXXX] (the page is then plain ASCII: no preconv needed)."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "".join(c if ord(c) < 128 else "\\[u%04X]" % ord(c) for c in text)


def inline(text):
    """Inline Markdown to roff font changes, text escaped."""
    for rx, rep in INLINE:
        text = rx.sub(rep, text)
    out = []
    pos = 0
    rx = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*|(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])")
    for m in rx.finditer(text):
        out.append(esc(text[pos:m.start()]))
        if m.group(1) is not None:
            out.append("\\fB" + esc(m.group(1)) + "\\fR")
        elif m.group(2) is not None:
            out.append("\\fB" + esc(m.group(2)) + "\\fR")
        else:
            out.append("\\fI" + esc(m.group(3)) + "\\fR")
        pos = m.end()
    out.append(esc(text[pos:]))
    return "".join(out)


def line_safe(s):
    """A roff text line must not start with '.' or '\''."""
    return "\\&" + s if s[:1] in (".", "'") else s


def cells(row):
    parts = re.split(r"(?<!\\)\|", row.strip())
    parts = parts[1:-1] if row.strip().startswith("|") else parts
    return [p.strip().replace("\\|", "|") for p in parts]


def convert(md, name, section, date):
    lines = md.split("\n")
    out = ['.TH %s %s "%s" "tierkv" "tierkv manual"' % (name.upper(), section, date),
           ".nh", ".ad l"]
    title = ""
    i = 0
    if lines and lines[0].startswith("# "):
        title = lines[0][2:].strip()
        i = 1
    if not any(l.strip() == "## NAME" for l in lines):
        what = re.split(r"\s+[—-]\s+", title, maxsplit=1)
        desc = what[1] if len(what) == 2 else title
        out += [".SH NAME", "%s \\- %s" % (esc(name), inline(desc)), ".SH DESCRIPTION"]
    para = []

    def flush():
        if para:
            out.append(".PP")
            out.append(line_safe(inline(" ".join(para))))
            para.clear()

    while i < len(lines):
        l = lines[i]
        s = l.strip()
        if s.startswith("```"):
            flush()
            i += 1
            out += [".RS 4", ".nf"]
            while i < len(lines) and not lines[i].strip().startswith("```"):
                out.append(line_safe(esc(lines[i])))
                i += 1
            out += [".fi", ".RE"]
            i += 1
            continue
        if l.startswith("    ") and not para and s:
            flush()
            out += [".RS 4", ".nf"]
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                if not lines[i].strip() and not (i + 1 < len(lines) and lines[i + 1].startswith("    ")):
                    break
                out.append(line_safe(esc(lines[i][4:])))
                i += 1
            out += [".fi", ".RE"]
            continue
        if s.startswith("### "):
            flush()
            out += [".SS " + inline(s[4:])]
        elif s.startswith("## "):
            flush()
            out += [".SH " + inline(s[3:].upper())]
        elif s.startswith("|"):
            flush()
            head = cells(s)
            i += 1
            if i < len(lines) and re.match(r"^\|?\s*:?-", lines[i].strip()):
                i += 1
            while i < len(lines) and lines[i].strip().startswith("|"):
                row = cells(lines[i])
                row += [""] * (len(head) - len(row))
                text = inline(row[-1]) if len(row) > 1 else ""
                extra = ["%s %s" % (inline(h), inline(c))
                         for h, c in zip(head[1:-1], row[1:-1]) if c]
                if extra:
                    text += " (" + "; ".join(extra) + ")"
                out += [".TP", line_safe(inline(row[0])), line_safe(text)]
                i += 1
            continue
        elif re.match(r"^(- |\* |\d+\. )", s) and not l.startswith("  "):
            flush()
            m = re.match(r"^(- |\* |\d+\. )(.*)", s)
            mark = "\\(bu" if m.group(1).strip() in ("-", "*") else m.group(1).strip()
            item = [m.group(2)]
            i += 1
            while i < len(lines) and lines[i].startswith("  ") and lines[i].strip():
                item.append(lines[i].strip())
                i += 1
            out += [".IP %s 4" % mark, line_safe(inline(" ".join(item)))]
            continue
        elif not s:
            flush()
        else:
            para.append(s)
        i += 1
    flush()
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--section", required=True)
    ap.add_argument("--date", default="2026")
    ap.add_argument("src")
    ap.add_argument("out")
    a = ap.parse_args()
    with open(a.src, encoding="utf-8") as f:
        md = f.read()
    page = convert(md, a.name, a.section, a.date)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
