#!/usr/bin/env python3
"""The HTTP server's answers to hostile and careless clients (issue 48,
"isolation"): single-node tierkvd processes on loopback.

Checks:
- A body over the limit (4 MiB + 1 and 64 MiB, with Content-Length and
  chunked) is answered 413, and a client that sends its whole body before it
  reads (as most do) reads that 413: no reset. The server shuts its side and
  drops what the client still sends (a lingering close, bounded in bytes and
  time), then closes.
- A client that never reads and keeps sending is cut off within the bound; one
  that sends nothing more is closed after the linger time; one whose
  Content-Length lies (shorter than what it sends) gets its answers and a 400
  for the rest, without a reset.
- Refused posts cost little: 8 clients posting 4 MiB + 1 at once, three times
  over: the node's longest loop turn and its CPU per refused post stay under
  bounds (printed).
- HTTPS: 40 half-open handshakes from one address hold 16 slots (the rest
  closed at accept); 1,200 from 100 addresses hold 256 (the cap); a normal
  request waits for the cap to free; at the handshake deadline
  (--header-timeout-ms) every slot is freed and a normal HTTPS request is
  served; the longest loop turn during the storm and the RSS before, at the
  peak and after are printed and bounded.

usage: http_limits_test.py path/to/tierkvd
"""
import os
import resource
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import Fail, Node, check, free_ports, request  # noqa: E402

TMP = tempfile.mkdtemp(prefix="tierkv-limits-")
MIB = 1 << 20


def start_node(binary, extra):
    port = free_ports(1)[0]
    args = ["--store", "mem", "--listen-http", "127.0.0.1:%d" % port] + extra
    nd = Node(binary, port, args, TMP)
    nd.http_port = port
    nd.start()
    deadline = time.time() + 15
    while time.time() < deadline:
        check(nd.alive(), "tierkvd exited: %s" % nd.log()[-2000:])
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return nd
        except OSError:
            time.sleep(0.05)
    raise Fail("tierkvd did not listen on %d" % port)


def metrics(port, conn=None):
    """The node's /metrics as {name-with-labels: value}; over `conn` (a kept
    HTTPS connection, its handshake long done) when given."""
    if conn is None:
        st, _, body = request(port, "GET", "/metrics", timeout=10)
    else:
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        st, body = r.status, r.read()
    check(st == 200, "/metrics: %d" % st)
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, val = line.rpartition(" ")
            try:
                out[name] = float(val)
            except ValueError:
                pass
    return out


def turn_max(m):
    return max(v for k, v in m.items() if k.startswith("tierkv_loop_turn_max_seconds{"))


def held_max(m):
    """The longest loop turn that held the CPU for 20 ms or more (0: none): the
    bounds are on it, as a turn stretched by preemption on a shared VM (the
    wall time, printed) holds little CPU."""
    return m["tierkv_loop_turn_held_max_seconds"] * 1000


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise Fail("no VmRSS")


def read_answer(s, timeout=10.0):
    """Reads until one complete HTTP answer (headers + Content-Length body)
    or EOF; returns (status, bytes) or raises OSError (a reset)."""
    s.settimeout(timeout)
    got = b""
    while True:
        end = got.find(b"\r\n\r\n")
        if end >= 0:
            head = got[:end].decode("latin-1").lower()
            n = 0
            for line in head.split("\r\n")[1:]:
                if line.startswith("content-length:"):
                    n = int(line.split(":", 1)[1])
            if len(got) >= end + 4 + n:
                return int(got[9:12]), got
        chunk = s.recv(65536)
        if not chunk:
            return (int(got[9:12]) if got.startswith(b"HTTP/1.1 ") else None), got
        got += chunk


def naive_post(port, n, chunked):
    """Sends headers and the whole body, then reads, as most clients do (a
    send failing on a reset is the bug). Returns the status read."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        if chunked:
            s.sendall(b"PUT /v1/kv/big HTTP/1.1\r\nHost: x\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n")
        else:
            s.sendall(b"PUT /v1/kv/big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % n)
        block = b"x" * (256 << 10)
        left = n
        while left > 0:
            k = min(left, len(block))
            if chunked:
                s.sendall(b"%x\r\n" % k + block[:k] + b"\r\n")
            else:
                s.sendall(block[:k])
            left -= k
        if chunked:
            s.sendall(b"0\r\n\r\n")
        status, _ = read_answer(s)
        return status
    finally:
        s.close()


def test_413_is_read(tierkvd):
    nd = start_node(tierkvd, [])
    port = nd.http_port
    for n in (4 * MIB + 1, 64 * MIB):
        for chunked in (False, True):
            what = "%d bytes %s" % (n, "chunked" if chunked else "with Content-Length")
            t0 = time.time()
            try:
                st = naive_post(port, n, chunked)
            except OSError as e:
                raise Fail("posting %s: %r instead of the 413" % (what, e))
            print("  %s: %s in %.2f s" % (what, st, time.time() - t0))
            check(st == 413, "posting %s: status %r, want 413" % (what, st))
    m = metrics(port)
    print("  dropped after the answers: %.0f MiB"
          % (m["tierkv_http_discarded_bytes_total"] / MIB))
    check(m["tierkv_http_discarded_bytes_total"] >= 64 * MIB,
          "the 64 MiB bodies were dropped, not read: %r" % m["tierkv_http_discarded_bytes_total"])

    # A client that never reads and keeps sending: cut off within the bounds
    # (128 MiB or 5 s after the answer), and the node serves others meanwhile
    # (a read needs the node to lead: the 413s above need no leader and may
    # all come before its first election ends on a busy machine).
    wait_for("the node ready", lambda: request(port, "GET", "/readyz")[0] == 200, 15)
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"PUT /v1/kv/big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (1 << 40))
    block = b"y" * (1 << 20)
    sent, t0, cut = 0, time.time(), None
    served = []
    while time.time() - t0 < 30:
        try:
            sent += s.send(block)
        except OSError as e:
            cut = e
            break
        if not served and sent > 16 * MIB:
            t1 = time.time()
            st, _, body = request(port, "GET", "/v1/kv/absent", timeout=10)
            served.append((st, time.time() - t1, body[:200]))
    dt = time.time() - t0
    s.close()
    print("  a client that never reads: cut after %.0f MiB in %.2f s (%r); a GET "
          "meanwhile: %r" % (sent / MIB, dt, cut, served))
    check(cut is not None, "a client sending forever was never cut off (%.0f MiB)" % (sent / MIB))
    check(dt < 3 * 5.0, "cut off after %.1f s (the linger time is 5 s)" % dt)
    check(served and served[0][0] == 404 and served[0][1] < 1.0,
          "a GET beside the discarding client: %r" % served)

    # A client that sends nothing more and never closes: its answer is
    # there, then the end of the stream (the node shut its side), and the
    # node closes its socket after the linger time (5 s).
    open0 = metrics(port)["tierkv_http_connections"]
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"PUT /v1/kv/big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (5 * MIB))
    t0 = time.time()
    status, got = read_answer(s, timeout=15)
    check(status == 413, "Content-Length over the limit: %r" % got[:60])
    s.settimeout(15)
    check(s.recv(1) == b"", "the node did not shut its side after the 413")
    check(metrics(port)["tierkv_http_connections"] == open0 + 1, "the lingering connection")
    wait_for("the lingering connection closed",
             lambda: metrics(port)["tierkv_http_connections"] == open0, 3 * 5.0)
    dt = time.time() - t0
    s.close()
    print("  a silent client after its 413: the node closed its socket after %.2f s" % dt)
    check(dt > 4.0, "closed after %.2f s, before the linger time" % dt)

    # A Content-Length that lies (10, then 1 MiB more): the first 10 bytes are
    # the body, the rest is not HTTP: 200, then 400, and no reset.
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"PUT /v1/kv/liar HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"
              + b"z" * (1 << 20))
    got = b""
    try:
        s.settimeout(10)
        while got.count(b"HTTP/1.1 ") < 2 or not got.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError as e:
        raise Fail("a lying Content-Length: %r after %r" % (e, got[:200]))
    s.close()
    statuses = [int(got[i + 9:i + 12]) for i in range(len(got)) if got.startswith(b"HTTP/1.1 ", i)]
    print("  a Content-Length that lies: %r" % statuses)
    check(statuses == [200, 400], "a lying Content-Length: %r" % got[:300])
    st, _, body = request(port, "GET", "/v1/kv/liar")
    check(st == 200 and b"zzzzzzzzzz" in body, "the liar's first 10 bytes: %d %r" % (st, body))
    nd.term()


def test_refused_posts_cost_little(tierkvd):
    nd = start_node(tierkvd, [])
    port = nd.http_port
    metrics(port)
    for chunked in (False, True):
        before = metrics(port)
        cpu0 = cpu_s(nd.proc.pid)
        results = []

        def post():
            try:
                results.append(naive_post(port, 4 * MIB + 1, chunked))
            except OSError as e:
                results.append(repr(e))

        rounds, clients = 3, 8
        t0 = time.time()
        for _ in range(rounds):
            ths = [threading.Thread(target=post) for _ in range(clients)]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
        dt = time.time() - t0
        cpu = cpu_s(nd.proc.pid) - cpu0
        after = metrics(port)
        per_ms = cpu / (rounds * clients) * 1000
        longest = turn_max(after) * 1000
        what = "chunked" if chunked else "Content-Length"
        held = held_max(after)
        print("  %d x %d posts of 4 MiB + 1 (%s): %.2f s; node CPU %.1f ms a refused post; "
              "longest loop turn %.1f ms (before %.1f ms), longest turn holding the CPU "
              "%.1f ms (before %.1f ms)" % (rounds, clients, what, dt, per_ms, longest,
                                            turn_max(before) * 1000, held, held_max(before)))
        check(results == [413] * (rounds * clients), "refused posts: %r" % results)
        # Measured (2-core VM, Dec 2026, MALLOC_PERTURB_ unset as in
        # production): Content-Length 0.8-1.7 ms CPU a post (dropping 4 MiB
        # read by read), turns of 6-13 ms; chunked (no length: buffered to the
        # limit first, then refused) 6-10 ms a post, turns of 17-210 ms (fresh
        # pages of the body buffers, as any 4 MiB upload): that turn is not
        # bounded here. Bounds: 3x and more. AddressSanitizer checks every
        # byte copied and poisons each fresh mapping: chunked there measured
        # 6-15 ms here and 31.2 ms on a loaded CI host (Dec 7), so 3x more.
        bound = (30.0 if chunked else 6.0) * (3 if asan(tierkvd) else 1)
        check(per_ms < bound,
              "a refused post costs the node %.1f ms of CPU" % per_ms)
        if not chunked:
            check(held < 60.0, "a loop turn of %.1f ms held the CPU while posts were "
                  "refused" % held)
    nd.term()


def put_8_large(port, prefix, timeout=30):
    """8 clients PUT 1 MiB values (byte 'a' + i) at once to prefix0..7; all
    must answer 200."""
    res = []

    def put(i):
        st, _, _ = request(port, "PUT", "/v1/kv/%s%d" % (prefix, i),
                           body=bytes([97 + i]) * (1 << 20), timeout=timeout)
        res.append(st)
    ths = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    check(res == [200] * 8, "8 PUTs of 1 MiB: %r" % res)


def test_large_bodies_put_off(tierkvd):
    """Large bodies are handed over at most 4 MiB of them a loop turn: all are
    answered, in order on a connection, and 8 batches refused after parsing
    (the command over the largest raft entry) cost turns of one parse or two."""
    import json
    nd = start_node(tierkvd, [])
    port = nd.http_port
    wait_for("the node ready", lambda: request(port, "GET", "/readyz")[0] == 200, 15)
    # Pipelined on one connection: two 1 MiB PUTs and a GET of the first.
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    v1, v2 = b"a" * (1 << 20), b"b" * (1 << 20)
    s.sendall(b"PUT /v1/kv/p1 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(v1)
              + v1 + b"PUT /v1/kv/p2 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
              % len(v2) + v2 + b"GET /v1/kv/p1 HTTP/1.1\r\nHost: x\r\n\r\n")
    raw = b""
    deadline = time.time() + 20
    while raw.count(b"HTTP/1.1 ") < 3 or not raw.endswith(b"\n"):
        check(time.time() < deadline, "pipelined large PUTs: %r" % raw[:300])
        chunk = s.recv(1 << 20)
        if not chunk:
            break
        raw += chunk
    s.close()
    got = [int(raw[i + 9:i + 12]) for i in range(len(raw)) if raw.startswith(b"HTTP/1.1 ", i)]
    check(got == [200, 200, 200] and b"a" * 1000 in raw[-(1 << 20) - 500:],
          "pipelined large PUTs and a GET: %r %r" % (got, raw[-200:]))
    # 8 clients, 1 MiB values at once: every value intact.
    put_8_large(port, "big")
    for i in range(8):
        st, _, body = request(port, "GET", "/v1/kv/big%d" % i)
        check(st == 200 and json.loads(body)["value"] == chr(97 + i) * (1 << 20),
              "value big%d after the PUTs" % i)
    # 8 batches of 4 x (1 MiB - 200) values: each body fits, its command does
    # not (413 after parsing, in api_kv.c). The parse is the cost.
    ops = [{"op": "put", "key": "k%d" % i, "value": "v" * ((1 << 20) - 200)} for i in range(4)]
    batch = json.dumps({"ops": ops}).encode()
    before = metrics(port)
    cpu0 = cpu_s(nd.proc.pid)
    res = []

    def post():
        st, _, _ = request(port, "POST", "/v1/batch", body=batch,
                           headers={"Content-Type": "application/json"}, timeout=30)
        res.append(st)
    ths = [threading.Thread(target=post) for _ in range(8)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    after = metrics(port)
    per_ms = (cpu_s(nd.proc.pid) - cpu0) / 8 * 1000
    put_off = after["tierkv_http_requests_put_off_total"] - before[
        "tierkv_http_requests_put_off_total"]
    print("  8 batches of %d bytes refused after parsing: %r; node CPU %.1f ms a post; "
          "longest loop turn %.1f ms, holding the CPU %.1f ms; %d put off to a later turn"
          % (len(batch), sorted(set(res)), per_ms, turn_max(after) * 1000, held_max(after),
             put_off))
    check(res == [413] * 8, "batches over the entry limit: %r" % res)
    # Measured: 50-70 ms of CPU a post (the JSON parse); longest turn holding
    # the CPU 130-160 ms with at most 4 MiB of bodies handed over a turn (all
    # 8 in one turn before: 372 ms). Bound: 3x the turn of one parse or two.
    check(held_max(after) < 450.0, "a turn of %.1f ms held the CPU" % held_max(after))
    nd.term()


def test_large_writes_admitted_in_turn(tierkvd):
    """Large writes go to the node one at a time (or within 4 MiB in
    flight): 8 clients putting 1 MiB values at once all get 200, some had to
    wait their turn (tierkv_http_bodies_admit_waited_total grows), nothing
    is left waiting or counted in flight afterwards, every value is intact,
    and a connection's pipelined small write after its large one on the same
    key wins (its order kept while the large one waits). Three nodes: a
    write is in flight for a replication's round trip (one node alone ends
    each in the turn that submits it, so none ever waits)."""
    import json
    import tkcluster
    c = tkcluster.Cluster(tierkvd, 3)
    c.start()
    port = c.node(c.wait_leader()).http_port

    waited = 0
    rounds = 0
    # 8 PUTs of 1 MiB at once: the bodies of a loop turn (4 MiB at most) are
    # submitted together, 3 fit in flight and the next waits. A round
    # without any wait is possible (each arrived after the last ended), so
    # up to 5 rounds are tried.
    while waited == 0 and rounds < 5:
        rounds += 1
        before = metrics(port)
        put_8_large(port, "adm", timeout=60)
        after = metrics(port)
        waited += after["tierkv_http_bodies_admit_waited_total"] - before[
            "tierkv_http_bodies_admit_waited_total"]
    print("  %d large writes waited their turn in %d round(s) of 8" % (waited, rounds))
    check(waited >= 1, "no large write ever waited: admission is not in effect")
    m = metrics(port)
    check(m["tierkv_http_bodies_admit_waiting"] == 0 and
          m["tierkv_http_bodies_admit_inflight_bytes"] == 0,
          "left waiting %r, in flight %r" % (m["tierkv_http_bodies_admit_waiting"],
                                             m["tierkv_http_bodies_admit_inflight_bytes"]))
    for i in range(8):
        st, _, body = request(port, "GET", "/v1/kv/adm%d" % i)
        check(st == 200 and json.loads(body)["value"] == chr(97 + i) * (1 << 20),
              "value adm%d after the PUTs" % i)
    # Pipelined on one connection while another client's large writes are in
    # flight: a 1 MiB PUT of k, then a small PUT of k, then a GET of k.
    bg = threading.Thread(target=lambda: request(
        port, "PUT", "/v1/kv/adm0", body=b"a" * (1 << 20), timeout=60))
    bg.start()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    v = b"x" * (1 << 20)
    s.sendall(b"PUT /v1/kv/ord HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(v)
              + v + b"PUT /v1/kv/ord HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nsmall"
              + b"GET /v1/kv/ord HTTP/1.1\r\nHost: x\r\n\r\n")
    raw = b""
    deadline = time.time() + 30
    while raw.count(b"HTTP/1.1 ") < 3 or not raw.endswith(b"\n"):
        check(time.time() < deadline, "pipelined writes: %r" % raw[:300])
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        raw += chunk
    s.close()
    bg.join(60)
    got = [int(raw[i + 9:i + 12]) for i in range(len(raw)) if raw.startswith(b"HTTP/1.1 ", i)]
    check(got == [200, 200, 200] and b'"value":"small"' in raw,
          "pipelined large then small PUT and a GET: %r %r" % (got, raw[-200:]))
    c.stop()


def test_idle_connections_parked(tierkvd):
    """Idle connections leave the loop's epoll set (parked after 1 s with
    nothing in flight): 12,000 idle clients are all parked, a parked
    connection still gets its answer, and when all of them leave at once
    (their process killed) the loop wakes at most 256 of them a turn: no turn
    holds the CPU 120 ms (a turn of 180-310 ms held the CPU before parking,
    with 15,000)."""
    want = 12000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < want + 512:
        print("  skipped: RLIMIT_NOFILE hard limit %d" % hard)
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        nd = start_node(tierkvd, [])  # inherits the raised limit
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    port = nd.http_port
    wait_for("the node ready", lambda: request(port, "GET", "/readyz")[0] == 200, 15)
    rss0 = rss_mib(nd.proc.pid)
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the clients: open, say how many, then sleep until killed
        os.close(rd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        socks = []
        for _ in range(want):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            except OSError:
                break
        os.write(wr, b"%d\n" % len(socks))
        time.sleep(600)
        os._exit(0)
    os.close(wr)
    try:
        opened = int(os.read(rd, 64).decode().strip() or "0")
        os.close(rd)
        check(opened >= want * 0.9, "only %d of %d connections opened" % (opened, want))
        sleeper = socket.create_connection(("127.0.0.1", port), timeout=10)
        wait_for("the idle connections parked",
                 lambda: metrics(port).get("tierkv_http_conns_parked", 0) >= opened, 30)
        # An idle connection holds no read buffer (16 KiB each when every
        # connection had its own: 188 MiB for these).
        grown = rss_mib(nd.proc.pid) - rss0
        print("  RSS grew %.1f MiB with %d idle connections" % (grown, opened))
        check(grown < 64, "RSS grew %.1f MiB with %d idle connections" % (grown, opened))
        sleeper.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        t = time.time()
        st, got = read_answer(sleeper, timeout=10)
        print("  %d idle connections parked; a parked one answered %r in %.1f ms"
              % (opened, st, (time.time() - t) * 1000))
        check(st == 200, "a parked connection's GET: %r" % got[:100])
        before = metrics(port)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    t = time.time()
    wait_for("the connections closed",
             lambda: metrics(port)["tierkv_http_connections"] <= 2, 30)
    after = metrics(port)
    unparked = after["tierkv_http_conns_unparked_total"] - before[
        "tierkv_http_conns_unparked_total"]
    print("  all left at once: closed in %.2f s, %d woken from the park; longest loop turn "
          "%.1f ms, holding the CPU %.1f ms" % (time.time() - t, unparked,
                                                turn_max(after) * 1000, held_max(after)))
    check(unparked >= opened * 0.99, "only %d of %d woken from the park" % (unparked, opened))
    check(held_max(after) < 120.0, "a turn of %.1f ms held the CPU" % held_max(after))
    sleeper.close()
    nd.term()


def make_cert():
    p = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", "srv.key", "-out", "srv.pem", "-days", "2", "-subj",
         "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        capture_output=True, timeout=60, cwd=TMP)
    if p.returncode != 0:
        raise Fail("openssl: %s" % p.stderr.decode(errors="replace"))
    os.chmod(os.path.join(TMP, "srv.key"), 0o600)


def client_hello():
    """The bytes of one TLS ClientHello (the handshake is never continued)."""
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    c.check_hostname = False
    c.verify_mode = ssl.CERT_NONE
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = c.wrap_bio(inc, out, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def half_open(port, src, hello):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    s.sendall(hello)
    return s


def wait_for(what, cond, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise Fail("not within %.0f s: %s" % (timeout, what))


def https_get(port, context, timeout=10):
    """The status of a GET over a new HTTPS connection; None if refused."""
    import http.client
    c = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=timeout)
    try:
        c.request("GET", "/v1/kv/absent")
        return c.getresponse().status
    except (OSError, ssl.SSLError, http.client.HTTPException):
        return None
    finally:
        c.close()


def asan(binary):
    """Whether `binary` was built with AddressSanitizer."""
    with open(binary, "rb") as f:
        return b"__asan_init" in f.read()


def test_tls_handshake_storm(tierkvd):
    make_cert()
    deadline_ms = 6000  # well past the ~1.2 s the 1,200 take to send
    nd = start_node(tierkvd, ["--cert-file", os.path.join(TMP, "srv.pem"), "--key-file",
                              os.path.join(TMP, "srv.key"), "--header-timeout-ms",
                              str(deadline_ms)])
    port, pid = nd.http_port, nd.proc.pid
    ctx = ssl.create_default_context(cafile=os.path.join(TMP, "srv.pem"))
    wait_for("HTTPS served", lambda: https_get(port, ctx) == 404, 10)
    for _ in range(20):
        https_get(port, ctx)
    hello = client_hello()
    import http.client
    mc = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    rss0 = rss_mib(pid)
    m0 = metrics(port, mc)

    def gauge():
        return metrics(port, mc)["tierkv_http_tls_handshakes"]

    # One address: 16 slots, the rest closed at accept.
    socks = [half_open(port, "127.0.0.2", hello) for _ in range(40)]
    wait_for("16 handshakes from one address", lambda: gauge() == 16, 10)
    m = metrics(port, mc)
    refused = m["tierkv_http_tls_refused_total"] - m0["tierkv_http_tls_refused_total"]
    print("  40 half-open handshakes from one address: 16 held, %d refused" % refused)
    check(refused == 24, "refused from one address: %d, want 24" % refused)
    for s in socks:
        s.close()
    wait_for("the slots of closed connections freed", lambda: gauge() == 0, 10)

    # 1,200 from 100 addresses (12 each): the overall cap holds 256.
    m1 = metrics(port, mc)
    t0 = time.time()
    socks = []
    for i in range(1200):
        socks.append(half_open(port, "127.0.1.%d" % (1 + i % 100), hello))
    opened = time.time() - t0
    wait_for("256 handshakes held", lambda: metrics(port, mc)["tierkv_http_tls_refused_total"]
             - m1["tierkv_http_tls_refused_total"] >= 1200 - 256, 4)
    m = metrics(port, mc)
    held = 1200 - (m["tierkv_http_tls_refused_total"] - m1["tierkv_http_tls_refused_total"])
    rss_peak = rss_mib(pid)
    storm_turn = held_max(m)
    print("  1,200 half-open handshakes from 100 addresses (sent in %.2f s): %d held, %d "
          "refused; longest loop turn %.1f ms (before %.1f ms), holding the CPU %.1f ms; "
          "%d accepts put off to a later turn"
          % (opened, held, 1200 - held, turn_max(m) * 1000, turn_max(m0) * 1000, storm_turn,
             m["tierkv_http_accepts_deferred_total"] - m0["tierkv_http_accepts_deferred_total"]))
    check(held == 256, "handshakes held: %d, want 256 (the cap)" % held)
    # Measured (2-core VM): 36-62 ms with the caps, 64 accepts and 8 ms of
    # handshakes a turn (before: 3,000 in one turn, 417 ms; 1,200 capped but
    # without the handshake budget, 172 ms). Bound: 3x.
    check(storm_turn < 200.0, "a loop turn of %.1f ms in the storm" % storm_turn)
    # A normal client meanwhile: refused at accept while 256 are held.
    st = https_get(port, ctx, timeout=5)
    during = "refused at accept" if st is None else "status %d" % st
    print("  a normal HTTPS request while the cap is full: %s" % during)
    # The deadline frees every slot and its memory.
    t0 = time.time()
    wait_for("the slots freed at the deadline", lambda: https_get(port, ctx) == 404,
             3 * deadline_ms / 1000.0 + 5)
    freed = time.time() - t0
    wait_for("every slot freed", lambda: gauge() == 0, 3 * deadline_ms / 1000.0 + 5)
    m = metrics(port, mc)
    timeouts = m["tierkv_http_tls_handshake_timeouts_total"] - m0[
        "tierkv_http_tls_handshake_timeouts_total"]
    check(timeouts == 256, "handshakes cut at the deadline: %d, want 256" % timeouts)
    check(m["tierkv_http_tls_handshakes"] == 0, "handshakes still held: %r"
          % m["tierkv_http_tls_handshakes"])
    for s in socks:
        s.close()
    time.sleep(0.2)  # (not a condition: RSS settles as the closes are handled)
    rss1 = rss_mib(pid)
    print("  slots free %.2f s after the storm; RSS before %.1f MiB, peak %.1f MiB, "
          "after %.1f MiB" % (freed, rss0, rss_peak, rss1))
    m = metrics(port, mc)
    after_turn = held_max(m)
    print("  longest loop turn by the end (the deadline's closes, malloc_trim): %.1f ms, "
          "holding the CPU %.1f ms; trims %d"
          % (turn_max(m) * 1000, after_turn, m["tierkv_http_mem_trims_total"]))
    # Measured: 60-80 ms (256 handshakes cut at one deadline). Bound: 3x.
    check(after_turn < 250.0, "a loop turn of %.1f ms after the storm" % after_turn)
    check(m["tierkv_http_mem_trims_total"] >= 1, "no malloc_trim after the storm")
    if asan(tierkvd):
        # AddressSanitizer keeps freed memory in its quarantine (256 MiB)
        # and malloc_trim does not reach its allocator: RSS says nothing.
        print("  (AddressSanitizer build: RSS bounds not checked)")
    else:
        check(rss_peak - rss0 < 64, "the storm grew the node by %.1f MiB"
              % (rss_peak - rss0))
        check(rss1 - rss0 < 16, "RSS after the storm: %.1f MiB over before" % (rss1 - rss0))
    nd.term()


def main():
    tierkvd = sys.argv[1]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    tests = [test_413_is_read, test_refused_posts_cost_little, test_large_bodies_put_off,
             test_large_writes_admitted_in_turn, test_idle_connections_parked,
             test_tls_handshake_storm]
    failed = 0
    for t in tests:
        print("%s:" % t.__name__, flush=True)
        try:
            t(tierkvd)
            print("  ok", flush=True)
        except Fail as e:
            failed += 1
            print("  FAIL: %s" % e, flush=True)
    print("%d passed, %d failed" % (len(tests) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
