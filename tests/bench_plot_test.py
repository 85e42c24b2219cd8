#!/usr/bin/env python3
"""Every benchmark program's --plot FILE.svg, on a tiny configuration.

  bench_plot_test.py BUILD_DIR SOURCE_DIR quick|slow

quick (suite unit, ~20 s): bench-plot (the helper's front end for scripts: a
good spec makes an SVG; a bad statement exits 2 and a failing gnuplot exits 1,
neither leaving a file), store-bench --quick, transport-bench --quick,
raft-perf-probe (1 s) and `tierkv bench` against tierkv-fake-server (2 s).
slow (suite slow): kv-bench --quick and scripts/bench-http.sh (tierkvd only,
two 1 s rows; etcd is not installed for a test).

Each SVG must parse as XML with an <svg> root, carry the plot's title and its
series' names as text, and draw at least one path. Exit 77 without gnuplot
(outside CI, where that fails).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

FAILS = []


def svg_problem(path, must_say):
    """None when `path` is a gnuplot SVG showing every string of must_say."""
    if not os.path.exists(path):
        return "no file"
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        return "not XML: %s" % e
    if not root.tag.endswith("svg"):
        return "root is <%s>, not <svg>" % root.tag
    text = " ".join("".join(el.itertext()) for el in root.iter() if el.tag.endswith("text"))
    missing = [s for s in must_say if s not in text]
    if missing:
        return "does not show %s" % missing
    if not any(el.tag.endswith("path") and len(el.get("d", "")) > 20 for el in root.iter()):
        return "draws no line"
    return None


def self_test(tmp):
    """The SVG check rejects a missing file, non-XML, an empty plot and a
    plot without the expected names."""
    bad_xml = os.path.join(tmp, "bad.svg")
    with open(bad_xml, "w") as f:
        f.write("<svg><text>x</svg")
    empty = os.path.join(tmp, "empty.svg")
    with open(empty, "w") as f:
        f.write('<svg xmlns="http://www.w3.org/2000/svg"><text>title</text></svg>')
    for path, say in ((os.path.join(tmp, "none.svg"), []), (bad_xml, []), (empty, ["title"]),
                      (empty, ["series"])):
        if svg_problem(path, say) is None:
            sys.exit("self-test: the SVG check accepted %s" % path)


def run(name, args, out, must_say, env=None, timeout=120, stdin=None):
    t = time.monotonic()
    e = dict(os.environ)
    e.update(env or {})
    try:
        p = subprocess.run(args, input=stdin, capture_output=True, text=True, env=e,
                           timeout=timeout)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        rc, err = "timeout", ""
    problem = "exit %s" % rc if rc != 0 else svg_problem(out, must_say)
    if problem:
        FAILS.append(name)
        print("FAIL %-16s %s\n%s" % (name, problem, err[-1500:]), flush=True)
    else:
        print("ok   %-16s %5.1f s  %s (%d bytes)" % (name, time.monotonic() - t, out,
                                                    os.path.getsize(out)), flush=True)


def bench_plot_cli(b, tmp):
    exe = os.path.join(b, "cmd", "benchplot", "bench-plot")
    spec = ("title planted title\npanel 1 0 left|x|y\nseries 0 alpha series\n"
            "point 1 2\npoint 10 3\nhline 0 2.5 the floor\n")
    run("bench-plot", [exe, os.path.join(tmp, "cli.svg")], os.path.join(tmp, "cli.svg"),
        ["planted title", "alpha series", "the floor"], stdin=spec)
    for what, text, env, want in (
            ("a bad statement", spec + "wiggle 3\n", {}, 2),
            ("a point before a series", "title t\npanel 0 0 a|b|c\npoint 1 1\n", {}, 2),
            ("a failing gnuplot", spec, {"GNUPLOT": "false"}, 1)):
        out = os.path.join(tmp, "rejected.svg")
        if os.path.exists(out):
            os.unlink(out)
        p = subprocess.run([exe, out], input=text, capture_output=True, text=True,
                           env=dict(os.environ, **env), timeout=30)
        if p.returncode != want or os.path.exists(out) or not p.stderr.strip():
            FAILS.append("bench-plot " + what)
            print("FAIL bench-plot with %s: exit %d (want %d), file left: %s, said %r"
                  % (what, p.returncode, want, os.path.exists(out), p.stderr))
        else:
            print("ok   bench-plot rejects %s: %s" % (what, p.stderr.strip().splitlines()[-1]))


def tierkv_bench(b, tmp):
    fake = subprocess.Popen([os.path.join(b, "cmd", "tierkv", "tierkv-fake-server"),
                             "--port-file", os.path.join(tmp, "port")])
    try:
        pf = os.path.join(tmp, "port")
        deadline = time.monotonic() + 10
        while not (os.path.exists(pf) and os.path.getsize(pf) > 0):
            if time.monotonic() > deadline:
                FAILS.append("tierkv bench")
                print("FAIL tierkv bench: the fake server did not start")
                return
            time.sleep(0.05)
        with open(pf) as f:
            ep = "127.0.0.1:" + f.read().strip()
        out = os.path.join(tmp, "tierkv-bench.svg")
        run("tierkv bench", [os.path.join(b, "cmd", "tierkv", "tierkv"), "-e", ep, "bench",
                             "-d", "2500ms", "--warmup", "200ms", "-c", "4", "--runs", "2",
                             "--plot", out], out, ["tierkv bench", "run 1", "run 2"])
    finally:
        fake.kill()
        fake.wait()


def main():
    b, src, group = sys.argv[1], sys.argv[2], sys.argv[3]
    if shutil.which(os.environ.get("GNUPLOT", "gnuplot")) is None:
        if os.environ.get("CI", "") not in ("", "0", "false"):
            sys.exit("FAIL: no gnuplot under CI (scripts/deps.sh installs gnuplot-nox)")
        print("SKIP: no gnuplot")
        return 77
    tmp = tempfile.mkdtemp(prefix="tierkv-plots-")
    try:
        self_test(tmp)
        c = lambda *p: os.path.join(b, "cmd", *p)  # noqa: E731
        o = lambda n: os.path.join(tmp, n)  # noqa: E731
        if group == "quick":
            bench_plot_cli(b, tmp)
            run("store-bench", [c("store-bench", "store-bench"), "--quick", "--runs", "1",
                                "--dir", tmp, "--plot", o("store.svg")], o("store.svg"),
                ["store-bench", "1 appender (sync)", "64 appends in flight", "floor"])
            run("transport-bench", [c("transport-bench", "transport-bench"), "--quick",
                                    "--plot", o("transport.svg")], o("transport.svg"),
                ["transport-bench", "tcp", "floor: blocking sockets, p50"])
            run("raft-perf-probe", [c("raft-perf-probe", "raft-perf-probe"), "--plot",
                                    o("probe.svg")], o("probe.svg"),
                ["raft-perf-probe", "inproc/applied/mem"], env={"RAFT_PROBE_SECONDS": "1"})
            tierkv_bench(b, tmp)
        else:
            run("kv-bench", [c("kv-bench", "kv-bench"), "--quick", "--plot", o("kv.svg")],
                o("kv.svg"), ["kv-bench", "tierkv get hit", "LMDB get hit"], timeout=300)
            run("bench-http.sh", [os.path.join(src, "scripts", "bench-http.sh"), "--plot",
                                  o("http.svg"), b], o("http.svg"), ["tierkvd put"],
                env={"BENCH_SYSTEMS": "tierkv", "BENCH_RUNS": "1", "BENCH_DURATION": "1s",
                     "BENCH_ROWS": "put:1 put:4", "BENCH_DIR": o("http")}, timeout=300)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
