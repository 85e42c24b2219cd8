#!/usr/bin/env python3
"""docs/operations.md's procedures, run as written (issue 54 item 7: docs that
cannot drift).

The test reads docs/operations.md, takes the shell blocks (fenced ```sh blocks
and indented blocks) of four sections, in the order they are written:

    "Replace a failed node", "Grow 3 -> 5 -> 3", "Backup and restore",
    "Disaster recovery"

and runs each block with `bash -e -o pipefail` (`set -x`: every command is
shown) against real local clusters, with tierkvd and tierkv of the build dir
first on PATH. A block that fails fails the test (the block and its output are
printed); so does a section that is missing, renamed or left without a block.
Between blocks it checks what the doc promises (members, leaders, digests,
the data).

The doc names hosts and paths a reader has; each is replaced as in this
table, and nothing else is changed:

    hN:7001               127.0.0.1:<raft port of node N> of the cluster the
                          section works on (for "Backup and restore": the new,
                          restored cluster)
    hN:8080               127.0.0.1:<HTTP port of node N>, likewise
    127.0.0.1:800N        127.0.0.1:<HTTP port of node N> of the running
                          cluster started as `make run` names it (the backup's
                          source in "Backup and restore")
    /var/lib/tierkv/N     <the test's temporary dir>/nN (node N's data dir)
    [...]                 dropped: an optional part (`[--peer-token-file F]`;
                          the test's clusters run without a cluster token)
    tierkvd --id N ...    `...` is "every flag it had": node N's original flags
                          (but --id)
    `# likewise on nodes A and B` after a command: the command is run again
                          for node A and for node B, with its --id, its
                          hN:8080 and its /var/lib/tierkv/N made A's, then B's
    `\\` + newline        joins the command's lines (before the above)

Each block runs in a working directory of its own section (tierkv.backup is
written there) with no TIERKV_* variable set but TIERKV_ENDPOINTS: the live
nodes' HTTP addresses where the doc says so ("Replace a failed node"), else
127.0.0.1:1, where nothing answers (a tierkv command must name its endpoints,
as "Grow 3 -> 5 -> 3" exports them and the others pass -e / --endpoints).
Nodes a block starts in the background are found by the block's own `jobs -p`
(at its exit) and stopped at the end of the section; anything left running
under the test's directories is killed at exit.

usage: ops_doc_test.py TIERKVD TIERKV [DOC]   (DOC: docs/operations.md)
"""
import atexit
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tkcluster as tk  # noqa: E402

SECTIONS = ["Replace a failed node", "Grow 3 -> 5 -> 3", "Backup and restore",
            "Disaster recovery"]
BLOCK_TIMEOUT = 90  # s; each block took 0-2 s (Dec 6 2026, the 2-core VM)
KEYS = 60

_roots = []   # every directory whose processes the test started


# ---------------------------------------------------------------- the doc

def heading(line):
    m = re.match(r"^(#{1,6})\s+(.*?)\s*$", line)
    return (len(m.group(1)), m.group(2)) if m else None


def parse_sections(text):
    """{title: [block text, ...]} for the four sections: ```sh fences and
    indented blocks (4+ spaces after a blank line), in order."""
    lines = text.split("\n")
    found = {}
    i = 0
    cur, cur_level = None, 0
    fence = None          # the fence's language while inside one
    fence_lines = []
    prev_blank = True
    while i < len(lines):
        ln = lines[i]
        if fence is not None:
            if ln.strip().startswith("```"):
                if fence == "sh" and cur is not None:
                    found[cur].append("\n".join(fence_lines))
                fence = None
                prev_blank = False
            else:
                fence_lines.append(ln)
            i += 1
            continue
        if ln.strip().startswith("```"):
            fence = ln.strip()[3:].strip()
            fence_lines = []
            i += 1
            continue
        h = heading(ln)
        if h:
            level, title = h
            if cur is not None and level <= cur_level:
                cur = None
            if title in SECTIONS:
                cur, cur_level = title, level
                found.setdefault(cur, [])
            prev_blank = False
            i += 1
            continue
        if cur is not None and prev_blank and re.match(r"^ {4,}\S", ln):
            block = []
            while i < len(lines) and re.match(r"^ {4,}\S", lines[i]):
                block.append(lines[i])
                i += 1
            ind = min(len(b) - len(b.lstrip(" ")) for b in block)
            found[cur].append("\n".join(b[ind:] for b in block))
            prev_blank = False
            continue
        prev_blank = ln.strip() == ""
        i += 1
    return found


class Ctx:
    """What the placeholders of one section mean."""

    def __init__(self, name, work):
        self.name = name
        self.work = work          # the section's directory (blocks' cwd)
        self.raft = {}            # id -> raft port (hN:7001)
        self.http = {}            # id -> HTTP port (hN:8080)
        self.dirs = {}            # id -> data dir (/var/lib/tierkv/N)
        self.old_http = {}        # id -> HTTP port (127.0.0.1:800N)
        self.flags = {}           # id -> original flags ("...")
        # TIERKV_ENDPOINTS: a closed port unless the doc says what it names
        self.env = {"TIERKV_ENDPOINTS": "127.0.0.1:1"}
        self.pids = []            # background nodes the blocks started


def substitute(block, ctx):
    """The block with the table's substitutions (module docstring)."""
    s = re.sub(r"\\\n\s*", " ", block)
    out = []
    for ln in s.split("\n"):
        m = re.search(r"#\s*likewise on nodes (\d+) and (\d+)", ln)
        if m:
            me = re.search(r"--id (\d+)\b", ln)
            if not me:
                raise tk.Fail("'likewise' without --id in: " + ln)
            n0 = me.group(1)
            out.append(ln)
            for n in (m.group(1), m.group(2)):
                x = re.sub(r"--id %s\b" % n0, "--id " + n, ln)
                x = re.sub(r"\bh%s:8080\b" % n0, "h%s:8080" % n, x)
                x = re.sub(r"/var/lib/tierkv/%s\b" % n0, "/var/lib/tierkv/" + n, x)
                out.append(x)
        else:
            out.append(ln)
    s = "\n".join(out)

    def need(table, n, what):
        n = int(n)
        if n not in table:
            raise tk.Fail("%s: node %d has no %s in this test" % (ctx.name, n, what))
        return table[n]

    s = re.sub(r"\bh(\d+):7001\b",
               lambda m: "127.0.0.1:%d" % need(ctx.raft, m.group(1), "raft port"), s)
    s = re.sub(r"\bh(\d+):8080\b",
               lambda m: "127.0.0.1:%d" % need(ctx.http, m.group(1), "HTTP port"), s)
    s = re.sub(r"\b127\.0\.0\.1:800(\d)\b",
               lambda m: "127.0.0.1:%d" % need(ctx.old_http, m.group(1),
                                               "running cluster's HTTP port"), s)
    s = re.sub(r"/var/lib/tierkv/(\d+)\b",
               lambda m: shlex.quote(need(ctx.dirs, m.group(1), "data dir")), s)
    s = re.sub(r" ?\[[^\]\n]*\]", "", s)

    def orig(m):
        n = int(m.group(1))
        flags = list(need(ctx.flags, n, "original flags"))
        j = flags.index("--id")
        del flags[j:j + 2]
        return "tierkvd --id %d %s" % (n, " ".join(shlex.quote(f) for f in flags))

    s = re.sub(r"\btierkvd --id (\d+) \.\.\.(?= |$)", orig, s, flags=re.M)
    if "..." in s or "/var/lib/tierkv" in s or re.search(r"\bh\d+:", s):
        raise tk.Fail("%s: a placeholder the table does not cover:\n%s" % (ctx.name, s))
    return s


def run_block(ctx, idx, block, bindir):
    script = substitute(block, ctx)
    base = os.path.join(ctx.work, "block%d" % idx)
    pidfile = base + ".pids"
    with open(base + ".sh", "w") as f:
        f.write("set -e -o pipefail\n")
        f.write("trap 'jobs -p > %s' EXIT\n" % shlex.quote(pidfile))
        f.write("PS4='+ '\nset -x\n")
        f.write(script + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERKV_")}
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.update(ctx.env)
    print("  -- %s, block %d:\n%s" % (ctx.name, idx, indent(block)), flush=True)
    t0 = time.time()
    with open(base + ".out", "wb") as out:
        p = subprocess.Popen(["bash", base + ".sh"], stdin=subprocess.DEVNULL,
                             stdout=out, stderr=subprocess.STDOUT, cwd=ctx.work, env=env)
        try:
            rc = p.wait(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            # Its children (a node in the foreground) are stopped with the section's.
            try:
                with open("/proc/%d/task/%d/children" % (p.pid, p.pid)) as f:
                    ctx.pids += [int(x) for x in f.read().split()]
            except OSError:
                pass
            p.kill()
            p.wait()
            rc = "timeout (%d s)" % BLOCK_TIMEOUT
    took = time.time() - t0
    try:
        with open(pidfile) as f:
            ctx.pids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    if rc != 0:
        with open(base + ".out", "rb") as f:
            output = f.read().decode("utf-8", "replace")
        raise tk.Fail("%s, block %d failed (exit %s after %.1f s)\n"
                      "--- the block as written:\n%s\n--- as run (%s):\n%s\n"
                      "--- its output (and its background nodes' logs):\n%s"
                      % (ctx.name, idx, rc, took, indent(block), base + ".sh",
                         indent(script), indent(output[-12000:])))
    print("     ok (%.1f s)" % took, flush=True)


def indent(s):
    return "\n".join("    " + ln for ln in s.rstrip("\n").split("\n"))


# ---------------------------------------------------------------- processes

def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def ours(pid):
    c = cmdline(pid)
    return "tierkvd" in c and any(r in c for r in _roots)


def stop_pids(pids, timeout=15):
    """SIGTERM to the test's nodes among pids, then SIGKILL to those still
    running after `timeout` (bounded poll)."""
    pids = [p for p in pids if pid_alive(p) and ours(p)]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.time() + timeout
    while time.time() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    for p in pids:
        if pid_alive(p) and ours(p):
            os.kill(p, signal.SIGKILL)


def kill_leftovers():
    """Every tierkvd whose command line names one of the test's dirs."""
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid() and pid_alive(int(d)) and ours(int(d)):
            try:
                os.kill(int(d), signal.SIGKILL)
            except OSError:
                pass


atexit.register(kill_leftovers)


# ---------------------------------------------------------------- checks

def wait_for(cond, what, timeout=30):
    t0 = time.time()
    last = None
    while time.time() < t0 + timeout:
        try:
            v = cond()
        except (OSError, ValueError, KeyError, TypeError, tk.Fail) as e:
            v, last = None, e
        if v:
            return v
        time.sleep(0.05)
    raise tk.Fail("timed out after %d s waiting for %s%s"
                  % (timeout, what, " (last: %s)" % last if last else ""))


def status(port):
    st, _, js = tk.jreq(port, "GET", "/v1/cluster", timeout=3)
    return js if st == 200 else None


def leader_of(ports):
    """The id of the one leader all of `ports` agree on, else None."""
    sts = [status(p) for p in ports]
    if not all(sts):
        return None
    leaders = {s["leader"] for s in sts}
    lead = [s["id"] for s in sts if s["role"] == "leader"]
    if len(leaders) == 1 and len(lead) == 1 and lead[0] in leaders:
        return lead[0]
    return None


def wait_leader(ports, what, timeout=30):
    t0 = time.time()
    lead = wait_for(lambda: leader_of(ports), "one leader of " + what, timeout)
    print("     %s: node %d leads (%.2f s)" % (what, lead, time.time() - t0), flush=True)
    return lead


def voters(port):
    """(voters, learners) of the configuration, as /v1/members has them."""
    st, _, js = tk.jreq(port, "GET", "/v1/members", timeout=5)
    if st != 200:
        raise tk.Fail("GET /v1/members: %d" % st)
    v = sorted(m["id"] for m in js["members"] if m["role"] == "voter")
    ln = sorted(m["id"] for m in js["members"] if m["role"] != "voter")
    return v, ln


def digests_equal(ports):
    ds = []
    for p in ports:
        st, _, js = tk.jreq(p, "GET", "/v1/debug/digest", timeout=10)
        if st != 200:
            return None
        ds.append((js["applied"], js["digest"]))
    if len({d for _, d in ds}) == 1 and len({a for a, _ in ds}) == 1:
        return ds
    return None


def put_keys(port, prefix, n=KEYS):
    for i in range(n):
        st, _, _ = tk.request(port, "PUT", "/v1/kv/%s%03d" % (prefix, i), "v%d" % i)
        tk.check(st == 200, "put %s%03d: %d" % (prefix, i, st))


def has_keys(port, prefix, n=KEYS):
    for i in range(n):
        st, _, data = tk.request(port, "GET", "/v1/kv/%s%03d?raw&consistency=stale"
                                 % (prefix, i), timeout=5)
        if st != 200 or data.decode() != "v%d" % i:
            raise tk.Fail("key %s%03d on port %d: %d %r" % (prefix, i, port, st, data[:60]))
    return True


def cli(bindir, ctx, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERKV_")}
    env.update(ctx.env)
    p = subprocess.run([os.path.join(bindir, "tierkv")] + list(args), capture_output=True,
                       text=True, timeout=60, env=env, cwd=ctx.work)
    return p.returncode, p.stdout, p.stderr


# ---------------------------------------------------------------- sections

def new_cluster(tierkvd):
    c = tk.Cluster(tierkvd, 3)
    _roots.append(c.dir)
    atexit.register(kill_leftovers)  # before the dir's removal (atexit is LIFO)
    c.start()
    return c


def section_ctx(name, c, ids_extra=(4, 5)):
    work = os.path.join(c.dir, "work")
    os.makedirs(work)
    ctx = Ctx(name, work)
    for nd in c.nodes:
        ctx.raft[nd.id] = c.raft_ports[nd.id - 1]
        ctx.http[nd.id] = nd.http_port
        ctx.dirs[nd.id] = os.path.join(c.dir, "n%d" % nd.id)
        ctx.flags[nd.id] = nd.args
    ports = tk.free_ports(2 * len(ids_extra))
    for k, n in enumerate(ids_extra):
        ctx.raft[n] = ports[2 * k]
        ctx.http[n] = ports[2 * k + 1]
        ctx.dirs[n] = os.path.join(c.dir, "n%d" % n)
    return ctx


def eps(ctx, ids):
    return ",".join("127.0.0.1:%d" % ctx.http[i] for i in ids)


def replace(tierkvd, blocks, bindir):
    """Node 3 loses its disk: killed, its data directory wiped; then the
    doc's block, with TIERKV_ENDPOINTS naming nodes 1 and 2."""
    c = new_cluster(tierkvd)
    ctx = section_ctx("Replace a failed node", c)
    try:
        lead = wait_leader(c.http_ports, "the cluster")
        put_keys(c.node(lead).http_port, "r")
        c.node(3).kill()
        shutil.rmtree(ctx.dirs[3])
        ctx.env["TIERKV_ENDPOINTS"] = eps(ctx, (1, 2))
        wait_leader([ctx.http[1], ctx.http[2]], "nodes 1 and 2")
        for i, b in enumerate(blocks):
            run_block(ctx, i + 1, b, bindir)
        # The doc: member add returns once 4 is a caught-up voter.
        v, ln = voters(ctx.http[1])
        tk.check(v == [1, 2, 4] and ln == [], "voters %r learners %r, want [1, 2, 4]" % (v, ln))
        rc, out, err = cli(bindir, ctx, "member", "list")
        tk.check(rc == 0, "tierkv member list: %d %s" % (rc, err))
        rows = {ln.split()[0]: ln.split() for ln in out.splitlines()
                if ln.split() and ln.split()[0].isdigit()}
        tk.check("4" in rows and "voter" in rows["4"] and "3" not in rows,
                 "tierkv member list does not show 4 a voter and 3 gone:\n" + out)
        print("     tierkv member list:\n" + indent(out), flush=True)
        ds = wait_for(lambda: digests_equal([ctx.http[i] for i in (1, 2, 4)]),
                      "equal digests on 1, 2, 4")
        has_keys(ctx.http[4], "r")
        print("     voters %r; digests (applied, digest) %r; node 4 has the %d keys"
              % (v, ds, KEYS), flush=True)
    finally:
        stop_pids(ctx.pids)
        c.stop()


def grow(tierkvd, blocks, bindir):
    c = new_cluster(tierkvd)
    ctx = section_ctx("Grow 3 -> 5 -> 3", c)
    try:
        lead = wait_leader(c.http_ports, "the cluster")
        put_keys(c.node(lead).http_port, "g")
        for i, b in enumerate(blocks):
            run_block(ctx, i + 1, b, bindir)
        # The block's last step, "on h1 and on h2, stop that node's tierkvd
        # with SIGTERM": a removed node stops cleanly.
        for n in (1, 2):
            if c.node(n).alive():
                code = c.node(n).term()
                tk.check(code == 0, "node %d (removed) stopped with exit %r" % (n, code))
        final = [ctx.http[i] for i in (3, 4, 5)]
        for n in (3, 4, 5):
            tk.check(status(ctx.http[n]) is not None,
                     "node %d does not answer after the block (did it stop it?)" % n)
        lead = wait_leader(final, "nodes 3, 4, 5")
        v, ln = voters(ctx.http[lead])
        tk.check(v == [3, 4, 5] and ln == [], "voters %r learners %r, want [3, 4, 5]" % (v, ln))
        st, _, _ = tk.request(ctx.http[4], "PUT", "/v1/kv/after-grow", "x")
        tk.check(st == 200, "a write after the shrink: %d" % st)
        ds = wait_for(lambda: digests_equal(final), "equal digests on 3, 4, 5")
        for p in final:
            has_keys(p, "g")
        print("     voters %r; digests %r; nodes 1 and 2 stopped (exit 0)" % (v, ds),
              flush=True)
    finally:
        stop_pids(ctx.pids)
        c.stop()


def backup(tierkvd, blocks, bindir):
    """The running cluster (127.0.0.1:800N) is saved; the file is restored
    into a new cluster (hN)."""
    old = new_cluster(tierkvd)
    # The new cluster's nodes 1-3: ports and empty data dirs of their own.
    work = os.path.join(old.dir, "work")
    os.makedirs(work)
    ctx = Ctx("Backup and restore", work)
    ports = tk.free_ports(6)
    for n in (1, 2, 3):
        ctx.raft[n], ctx.http[n] = ports[2 * n - 2], ports[2 * n - 1]
        ctx.dirs[n] = os.path.join(old.dir, "new", "n%d" % n)
        ctx.old_http[n] = old.http_ports[n - 1]
    try:
        lead = wait_leader(old.http_ports, "the running cluster")
        put_keys(old.node(lead).http_port, "b")
        tk.check(len(blocks) >= 2, "Backup and restore: %d blocks, want the save and the "
                 "restore" % len(blocks))
        run_block(ctx, 1, blocks[0], bindir)
        path = os.path.join(work, "tierkv.backup")
        tk.check(os.path.isfile(path), "no %s after the save" % path)
        rc, out, err = cli(bindir, ctx, "--json", "snapshot", "status", "tierkv.backup")
        tk.check(rc == 0, "snapshot status --json: %d %s %s" % (rc, out, err))
        info = json.loads(out)
        file_rev = info["revision"]
        print("     tierkv.backup: %s" % out.strip(), flush=True)
        old.stop()
        for i, b in enumerate(blocks[1:]):
            run_block(ctx, i + 2, b, bindir)
        new = [ctx.http[n] for n in (1, 2, 3)]
        wait_leader(new, "the restored cluster", timeout=45)
        ds = wait_for(lambda: digests_equal(new), "equal digests on the restored nodes")
        for p in new:
            has_keys(p, "b")
        st, _, raw = tk.request(new[0], "PUT", "/v1/kv/after-restore", "x")
        tk.check(st == 200, "a write on the restored cluster: %d" % st)
        rev = json.loads(raw)["revision"]
        tk.check(isinstance(rev, int) and rev > file_rev,
                 "the first write after the restore got revision %r, the file's is %r"
                 % (rev, file_rev))
        print("     restored nodes: digests %r, the %d keys on each; a new write got "
              "revision %d > the file's %d" % (ds, KEYS, rev, file_rev), flush=True)
    finally:
        stop_pids(ctx.pids)
        old.stop()


def disaster(tierkvd, blocks, bindir):
    """Nodes 1 and 3 are lost for good; node 2 survives (the doc's --id 2)."""
    c = new_cluster(tierkvd)
    ctx = section_ctx("Disaster recovery", c, ids_extra=(4,))
    try:
        lead = wait_leader(c.http_ports, "the cluster")
        put_keys(c.node(lead).http_port, "d")
        wait_for(lambda: digests_equal(c.http_ports), "the keys on every node")
        c.node(1).kill()
        c.node(3).kill()
        t0 = time.time()
        wait_for(lambda: status(ctx.http[2])["leader"] in (0, None, 2) and
                 status(ctx.http[2])["role"] != "leader", "node 2 to lose its leader")
        st_code = tk.jreq(ctx.http[2], "PUT", "/v1/kv/lost", {"value": "x"}, timeout=10)
        tk.check(st_code[0] == 503, "a write on the survivor alone: %d" % st_code[0])
        print("     survivor alone: PUT %d %s (%.2f s)"
              % (st_code[0], st_code[2], time.time() - t0), flush=True)
        # "Stop it, and start it once more with every flag it had plus
        # --force-new-cluster".
        t0 = time.time()
        code = c.node(2).term()
        tk.check(code == 0, "node 2's stop: exit %r" % code)
        print("     node 2 stopped (SIGTERM, %.2f s)" % (time.time() - t0), flush=True)
        tk.check(len(blocks) >= 2, "Disaster recovery: %d blocks, want the forced start "
                 "and the new node" % len(blocks))
        run_block(ctx, 1, blocks[0], bindir)
        t0 = time.time()
        wait_leader([ctx.http[2]], "the survivor")
        v, ln = voters(ctx.http[2])
        tk.check(v == [2] and ln == [], "voters %r learners %r, want [2] alone" % (v, ln))
        st, _, _ = wait_for(lambda: (lambda r: r if r[0] == 200 else None)(
            tk.request(ctx.http[2], "PUT", "/v1/kv/after-dr", "x")), "a write on the survivor")
        has_keys(ctx.http[2], "d")
        print("     the survivor leads alone and took a write %.2f s after its start"
              % (time.time() - t0), flush=True)
        for i, b in enumerate(blocks[1:]):
            run_block(ctx, i + 2, b, bindir)
        v, ln = voters(ctx.http[2])
        tk.check(v == [2, 4] and ln == [], "voters %r learners %r, want [2, 4]" % (v, ln))
        ds = wait_for(lambda: digests_equal([ctx.http[2], ctx.http[4]]),
                      "equal digests on 2 and 4")
        has_keys(ctx.http[4], "d")
        print("     voters %r; digests %r; node 4 has the keys" % (v, ds), flush=True)
    finally:
        stop_pids(ctx.pids)
        c.stop()


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    tierkvd, tierkv = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    doc = sys.argv[3] if len(sys.argv) > 3 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "operations.md")
    with open(doc) as f:
        found = parse_sections(f.read())
    bad = [s for s in SECTIONS if not found.get(s)]
    if bad:
        print("FAIL %s: section(s) missing or without a shell block: %s"
              % (doc, ", ".join(repr(s) for s in bad)))
        return 1
    for s in SECTIONS:
        print("%s: %d block(s)" % (s, len(found[s])))
    bindir = tempfile.mkdtemp(prefix="tierkv-opsdoc-bin-")
    atexit.register(shutil.rmtree, bindir, True)
    os.symlink(tierkvd, os.path.join(bindir, "tierkvd"))
    os.symlink(tierkv, os.path.join(bindir, "tierkv"))

    t0 = time.time()
    failed = 0
    for s, fn in zip(SECTIONS, (replace, grow, backup, disaster)):
        t = time.time()
        try:
            fn(tierkvd, found[s], bindir)
            print("ok   %-30s %.1f s" % (s, time.time() - t), flush=True)
        except Exception as e:  # report and go on with the next section
            failed += 1
            print("FAIL %-30s %s: %s" % (s, type(e).__name__, e), flush=True)
    print("total %.1f s" % (time.time() - t0))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
