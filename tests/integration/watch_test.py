#!/usr/bin/env python3
"""Watch with three real tierkvd processes on loopback (fs store).

Writers send mixed puts, deletes, TTL puts (expired by the leader's expire
commands), transactions and delete ranges through every node while five
watchers on different nodes and ranges follow the change log
(GET /v1/watch, NDJSON); the leader is killed twice (and restarted). A
watcher whose connection breaks resumes from the last revision it saw whole,
on any node that still holds it. At the end each watcher's events must equal
exactly the committed history for its range: the change log of a node that
was never killed, read from revision 1, which the other nodes' logs must
agree with, and which must hold every write a client saw acknowledged at its
revision. Also: SSE framing, 410 compacted, a future start_revision, and a
lagging watcher cancelled while writes go on.

usage: watch_test.py path/to/tierkvd [writes [path/to/tierkv]]
"""
import http.client
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import Cluster, Fail, check, finish, jreq, request, run  # noqa: E402

C = None
WRITES = 10000
CLI = None  # the tierkv binary, for the CLI's watch


class Watcher(threading.Thread):
    """Follows one range from start_revision 1, resuming after any break."""

    def __init__(self, name, first_node, query):
        super().__init__(daemon=True)
        self.name, self.node, self.query = name, first_node, query
        self.events = []        # (revision, type, key, value) of whole revisions
        self.complete = 0       # every revision <= this has been seen whole
        self.stop = False
        self.resumes = 0
        self.errors = []

    def _stream(self, nd):
        c = http.client.HTTPConnection("127.0.0.1", nd.http_port, timeout=2)
        path = "/v1/watch?%s&start_revision=%d&progress_ms=100" % (self.query,
                                                                  self.complete + 1)
        c.request("GET", path)
        r = c.getresponse()
        if r.status != 200:
            body = r.read()
            c.close()
            return "status %d %s" % (r.status, body[:200])
        pending = []  # the events of the revision not yet known whole
        try:
            while not self.stop:
                line = r.readline()
                if not line:
                    return "eof"
                ev = json.loads(line)
                if "progress" in ev:
                    self.events += pending
                    pending = []
                    self.complete = max(self.complete, ev["progress"]["revision"])
                    continue
                if "error" in ev:
                    return "error %r" % ev["error"]
                rev = ev["revision"]
                if pending and pending[0][0] != rev:
                    self.events += pending
                    self.complete = pending[0][0]
                    pending = []
                pending.append((rev, ev["type"], ev["key"], ev.get("value")))
        except (OSError, http.client.HTTPException, ValueError) as e:
            return "broken: %s" % e
        finally:
            c.close()
        return "stopped"

    def run(self):
        order = [self.node] + [n for n in C.nodes if n is not self.node]
        i = 0
        while not self.stop:
            nd = order[i % len(order)]
            i += 1
            if not nd.alive():
                time.sleep(0.05)
                continue
            why = self._stream(nd)
            if not self.stop:
                self.resumes += 1
                self.errors.append(why)
                time.sleep(0.05)


def in_range(query, key):
    if query.startswith("start="):
        q = dict(p.split("=", 1) for p in query.split("&"))
        return q["start"] <= key and ("end" not in q or key < q["end"])
    k, _, v = query.partition("=")
    if k == "key":
        return key == v
    if k == "prefix":
        return key.startswith(v)
    raise Fail("range %s" % query)


class Writer(threading.Thread):
    def __init__(self, wid, n):
        super().__init__(daemon=True)
        self.wid, self.n = wid, n
        self.acked = []  # (revision, kind, key, value)
        self.rng = random.Random(wid)

    def send(self, method, path, body=None):
        for _ in range(200):
            nd = self.rng.choice([x for x in C.nodes if x.alive()] or C.nodes)
            try:
                if isinstance(body, dict):
                    st, _, js = jreq(nd.http_port, method, path, body, timeout=3)
                else:
                    st, _, data = request(nd.http_port, method, path, body, timeout=3)
                    js = json.loads(data) if st == 200 else None
            except (OSError, http.client.HTTPException, ValueError):
                time.sleep(0.02)
                continue
            if st == 200:
                return js
            time.sleep(0.02)
        raise Fail("writer %d: %s %s never succeeded" % (self.wid, method, path))

    def run(self):
        pfx = "ab"[self.wid % 2]
        for i in range(self.n):
            k = "%s/%d" % (pfx, self.rng.randrange(50))
            x = self.rng.random()
            if x < 0.55:
                v = "w%d-%d" % (self.wid, i)
                js = self.send("PUT", "/v1/kv/" + k, v)
                self.acked.append((js["revision"], "put", k, v))
            elif x < 0.70:
                self.send("DELETE", "/v1/kv/" + k)
            elif x < 0.85:
                v = "t%d-%d" % (self.wid, i)
                js = self.send("PUT", "/v1/kv/%s?ttl_ms=%d" % (k, self.rng.choice([50, 300])),
                               v)
                self.acked.append((js["revision"], "put", k, v))
            elif x < 0.97:
                k2 = "%s/%d" % (pfx, self.rng.randrange(50))
                v = "x%d-%d" % (self.wid, i)
                self.send("POST", "/v1/txn", {
                    "compare": [{"key": k, "target": "exists"}],
                    "then": [{"op": "put", "key": k2, "value": v}, {"op": "delete", "key": k}],
                    "else": [{"op": "put", "key": k, "value": v}]})
            else:
                self.send("DELETE", "/v1/kv?prefix=%s/%d" % (pfx, self.rng.randrange(5)))


def read_log(nd, until):
    """The whole change log of nd from revision 1 up to `until`."""
    deadline = time.time() + 30
    while time.time() < deadline:
        c = http.client.HTTPConnection("127.0.0.1", nd.http_port, timeout=5)
        c.request("GET", "/v1/watch?prefix=&start_revision=1&progress_ms=100")
        r = c.getresponse()
        if r.status != 200:
            c.close()
            return None, r.status
        out = []
        while True:
            ev = json.loads(r.readline())
            if "progress" in ev:
                if ev["progress"]["revision"] >= until:
                    c.close()
                    return [e for e in out if e[0] <= until], 200
                continue
            if "error" in ev:
                break
            out.append((ev["revision"], ev["type"], ev["key"], ev.get("value")))
        c.close()
    raise Fail("could not read the log of node %d" % nd.id)


def test_watchers_see_exactly_the_committed_history():
    C.wait_leader()
    specs = [("all", 1, "prefix="), ("a", 2, "prefix=a/"), ("b", 3, "prefix=b/"),
             ("a7", 1, "key=a/7"), ("b-on-2", 2, "prefix=b/1"),
             ("range", 3, "start=a/3&end=b/2")]
    watchers = [Watcher(n, C.node(i), q) for n, i, q in specs]
    for w in watchers:
        w.start()
    writers = [Writer(i, WRITES // 4) for i in range(4)]
    t0 = time.time()
    for w in writers:
        w.start()
    killed = []
    for frac in (0.3, 0.65):
        while sum(len(w.acked) for w in writers) < frac * WRITES * 0.7 and \
                any(w.is_alive() for w in writers):
            time.sleep(0.05)
        lead = C.wait_leader()
        C.node(lead).kill()
        killed.append(lead)
        time.sleep(0.3)
        C.node(lead).start()
    for w in writers:
        w.join(timeout=600)
        check(not w.is_alive(), "writer stuck")
    write_s = time.time() - t0
    # A last write: its revision bounds the history compared.
    js = Writer(99, 0).send("PUT", "/v1/kv/z/end", "end")
    end = js["revision"]
    deadline = time.time() + 60
    while any(w.complete < end for w in watchers) and time.time() < deadline:
        time.sleep(0.05)
    for w in watchers:
        w.stop = True
    check(all(w.complete >= end for w in watchers),
          "watchers behind %r (end %d)" % ([(w.name, w.complete, w.errors[-3:])
                                              for w in watchers], end))
    never = [nd for nd in C.nodes if nd.id not in killed]
    check(never, "every node was killed")
    ref, _ = read_log(never[0], end)
    check(ref, "node %d holds no log from revision 1" % never[0].id)
    # Every node's log agrees where it holds one.
    for nd in C.nodes:
        if nd is never[0]:
            continue
        st, _, cl = jreq(nd.http_port, "GET", "/v1/cluster")
        other, status = read_log(nd, end) if st == 200 else (None, st)
        if other is not None:
            check(other == ref, "node %d's log differs from node %d's" % (nd.id, never[0].id))
    # Revisions ordered, and every acknowledged put is in it at its revision.
    revs = [e[0] for e in ref]
    check(revs == sorted(revs), "history out of order")
    have = set(ref)
    for w in writers:
        for rev, kind, k, v in w.acked:
            check((rev, kind, k, v) in have, "acked %r missing from the log" % ((rev, kind, k, v),))
    kinds = {e[1] for e in ref}
    check(kinds == {"put", "delete", "expire"}, "event kinds %r" % kinds)
    for w in watchers:
        want = [e for e in ref if in_range(w.query, e[2])]
        got = [e for e in w.events if e[0] <= end]
        if got != want:
            n = next(i for i in range(min(len(got), len(want))) if got[i] != want[i]) \
                if any(got[i] != want[i] for i in range(min(len(got), len(want)))) else \
                min(len(got), len(want))
            raise Fail("watcher %s: %d events, want %d; first difference at %d: %r vs %r" %
                       (w.name, len(got), len(want), n, got[n:n + 2], want[n:n + 2]))
    print("  %d writes (%d acked puts) in %.1fs, history %d events up to revision %d, "
          "leaders killed %r, watcher resumes %r" %
          (WRITES, sum(len(w.acked) for w in writers), write_s, len(ref), end, killed,
           {w.name: w.resumes for w in watchers}))


def test_sse_frames_revisions_with_ids():
    lead = C.wait_leader()
    p = C.node(lead).http_port
    js = json.loads(request(p, "PUT", "/v1/kv/sse/1", "one")[2])
    rev = js["revision"]
    s = socket.create_connection(("127.0.0.1", p), timeout=5)
    s.sendall(b"GET /v1/watch?prefix=sse/&start_revision=%d HTTP/1.1\r\n"
              b"Accept: text/event-stream\r\n\r\n" % rev)
    buf = b""
    deadline = time.time() + 5
    while b"id: %d" % rev not in buf and time.time() < deadline:
        buf += s.recv(65536)
    s.close()
    check(b"Content-Type: text/event-stream" in buf, "content type: %r" % buf[:300])
    check(b'data: {"revision":%d,"type":"put","key":"sse/1","value":"one"' % rev in buf,
          "event: %r" % buf)
    check(b"id: %d\n\n" % rev in buf, "id: %r" % buf)
    # Last-Event-ID resumes after it: the next event only.
    request(p, "PUT", "/v1/kv/sse/2", "two")
    s = socket.create_connection(("127.0.0.1", p), timeout=5)
    s.sendall(b"GET /v1/watch?prefix=sse/ HTTP/1.1\r\nAccept: text/event-stream\r\n"
              b"Last-Event-ID: %d\r\n\r\n" % rev)
    buf = b""
    deadline = time.time() + 5
    while b"sse/2" not in buf and time.time() < deadline:
        buf += s.recv(65536)
    s.close()
    check(b"sse/2" in buf and b"sse/1" not in buf, "resumed: %r" % buf)


def test_future_start_revision_waits_and_sends_nothing_older():
    lead = C.wait_leader()
    p = C.node(lead).http_port
    rev = json.loads(request(p, "PUT", "/v1/kv/fut/0", "x")[2])["revision"]
    s = socket.create_connection(("127.0.0.1", p), timeout=10)
    s.sendall(b"GET /v1/watch?prefix=fut/&start_revision=%d HTTP/1.1\r\n\r\n" % (rev + 3))
    revs = []
    for i in range(1, 6):
        revs.append(json.loads(request(p, "PUT", "/v1/kv/fut/%d" % i, "y")[2])["revision"])
    buf = b""
    deadline = time.time() + 5
    while b'"fut/5"' not in buf and time.time() < deadline:
        buf += s.recv(65536)
    s.close()
    got = [json.loads(ln)["revision"] for part in buf.split(b"\r\n")
           for ln in part.split(b"\n") if ln.startswith(b"{")]
    check(got and min(got) >= rev + 3, "a future start sent %r (start %d)" % (got, rev + 3))
    check(b'"fut/5"' in buf, "the events from the start on: %r" % buf)


def test_compacted_start_is_410_with_compact_revision():
    # 20 MB of events (values and previous values) pass the log's 16 MiB.
    lead = C.wait_leader()
    p = C.node(lead).http_port
    big = "c" * 60000
    c = http.client.HTTPConnection("127.0.0.1", p, timeout=10)
    for i in range(170):
        c.request("PUT", "/v1/kv/c/%d" % (i % 10), big)
        r = c.getresponse()
        r.read()
    c.close()
    time.sleep(0.5)
    found = False
    for nd in C.nodes:
        st, _, js = jreq(nd.http_port, "GET", "/v1/watch?prefix=&start_revision=1")
        if st == 410:
            check(js["error"]["code"] == "compacted" and js["error"]["compact_revision"] >= 1,
                  "410 body %r" % js)
            found = True
    check(found, "no node answered 410 for revision 1")


def lagging_count(port):
    _, _, body = request(port, "GET", "/metrics")
    for ln in body.decode().splitlines():
        if ln.startswith("tierkv_watch_cancelled_lagging_total "):
            return int(ln.split()[1])
    raise Fail("no lagging counter in /metrics")


def test_a_slow_reader_catching_up_is_not_cancelled():
    # 6 MB of history (12 MB with the previous values the log keeps, under
    # its 16 MiB) read by a client that reads in small sips: its buffer fills
    # again and again, but it takes bytes, so it waits instead of being
    # cancelled.
    lead = C.wait_leader()
    p = C.node(lead).http_port
    big = "s" * 60000
    c = http.client.HTTPConnection("127.0.0.1", p, timeout=10)
    revs = []
    for i in range(100):
        c.request("PUT", "/v1/kv/slow/%d" % (i % 10), big)
        r = c.getresponse()
        revs.append(json.loads(r.read())["revision"])
    c.close()
    before = lagging_count(p)
    s = socket.create_connection(("127.0.0.1", p), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.sendall(b"GET /v1/watch?prefix=slow/&start_revision=%d HTTP/1.1\r\n\r\n" % revs[0])
    buf = b""
    want = b'"revision":%d,' % revs[-1]
    deadline = time.time() + 60
    while want not in buf and time.time() < deadline:
        chunk = s.recv(16384)
        if not chunk:
            break
        buf += chunk
        time.sleep(0.001)
    s.close()
    check(want in buf and b"lagging" not in buf,
          "slow reader: %d bytes, last revision seen? %s; it ends %r" %
          (len(buf), want in buf, buf[-300:]))
    check(lagging_count(p) == before, "a reader that takes bytes was cancelled")


def test_lagging_watcher_is_cancelled_and_writes_go_on():
    lead = C.wait_leader()
    p = C.node(lead).http_port
    before = lagging_count(p)
    s = socket.create_connection(("127.0.0.1", p), timeout=10)
    s.sendall(b"GET /v1/watch?prefix=lag/&progress_ms=100 HTTP/1.1\r\n\r\n")
    time.sleep(0.2)
    big = "v" * 60000
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", p, timeout=10)
    for i in range(200):  # 12 MB of events: past the kernel's buffers and 1 MiB
        c.request("PUT", "/v1/kv/lag/%d" % (i % 10), big)
        r = c.getresponse()
        r.read()
        check(r.status == 200, "write %d: %d" % (i, r.status))
    c.close()
    dt = time.time() - t0
    # Its client takes nothing: --watch-stall-ms (2 s here) later it is lagging.
    deadline = time.time() + 20
    while time.time() < deadline and lagging_count(p) < before + 1:
        time.sleep(0.05)
    check(lagging_count(p) >= before + 1, "the stalled watcher was not cancelled within 20 s")
    s.settimeout(10)
    buf = b""
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            chunk = s.recv(1 << 20)
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
    s.close()
    check(b'"code":"lagging","resume_revision":' in buf, "no lagging frame (%d bytes)" % len(buf))
    print("  200 writes of 60 KB with a stalled watcher: %.2fs; the watcher got %d bytes, "
          "then lagging" % (dt, len(buf)))


def test_cli_watch_resumes_without_gaps_or_repeats():
    if CLI is None:
        return
    import subprocess
    lead = C.wait_leader()
    first = C.node(lead)  # the endpoint it watches through first, killed below
    order = [first] + [n for n in C.nodes if n is not first]
    eps = ",".join("127.0.0.1:%d" % n.http_port for n in order)
    rev0 = json.loads(request(first.http_port, "PUT", "/v1/kv/cli/start", "s")[2])["revision"]
    w = subprocess.Popen([CLI, "-e", eps, "watch", "--prefix", "cli/", "--rev", str(rev0)],
                         stdout=subprocess.PIPE, text=True)
    want = [(rev0, "put", "cli/start", "s")]
    writer = Writer(7, 0)
    for i in range(60):
        if i == 30:
            first.kill()
        js = writer.send("PUT", "/v1/kv/cli/%d" % (i % 7), "v%d" % i)
        want.append((js["revision"], "put", "cli/%d" % (i % 7), "v%d" % i))
    first.start()
    deadline = time.time() + 20
    lines = []
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(w.stdout, selectors.EVENT_READ)
    while len(lines) < len(want) and time.time() < deadline:
        if sel.select(timeout=0.5):
            ln = w.stdout.readline()
            if not ln:
                break
            lines.append(ln.split())
    w.terminate()
    w.wait(timeout=10)
    got = [(int(a[0]), a[1], a[2], a[3] if len(a) > 3 else None) for a in lines]
    check(got == want, "tierkv watch printed %r, want %r" % (got[:5], want[:5]) if
          len(got) == len(want) else "tierkv watch printed %d events, want %d: %r" %
          (len(got), len(want), got[-3:]))


def main():
    global C, WRITES, CLI
    if len(sys.argv) > 2:
        WRITES = int(sys.argv[2])
    if len(sys.argv) > 3:
        CLI = sys.argv[3]
    C = Cluster(sys.argv[1], n=3, extra_args=["--watch-events", "20000",
                                              "--watch-stall-ms", "2000"])
    C.start()
    failed = run([test_watchers_see_exactly_the_committed_history,
                  test_sse_frames_revisions_with_ids,
                  test_future_start_revision_waits_and_sends_nothing_older,
                  test_cli_watch_resumes_without_gaps_or_repeats,
                  test_a_slow_reader_catching_up_is_not_cancelled,
                  test_lagging_watcher_is_cancelled_and_writes_go_on,
                  test_compacted_start_is_410_with_compact_revision])
    codes = C.stop()  # SIGTERM: each must exit 0 (a sanitizer's report would not)
    if any(c != 0 for c in codes.values()):
        print("FAIL exit codes %r" % codes)
        failed += 1
    finish(C, failed)


if __name__ == "__main__":
    main()
