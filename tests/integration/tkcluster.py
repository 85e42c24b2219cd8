"""Helpers for the tierkvd integration tests: start real tierkvd processes on
loopback with free ports, talk HTTP to them, and always clean up.

Only the Python standard library. Every process started here is killed when
the script exits, however it exits (normal end, exception, SIGINT, SIGTERM).
"""
import atexit
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

_procs = []


def _cleanup():
    for p in _procs:
        if p.poll() is None:
            try:
                p.kill()
                p.wait(timeout=5)
            except Exception:
                pass


def _on_signal(signum, frame):
    _cleanup()
    sys.exit(128 + signum)


atexit.register(_cleanup)
signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGINT, _on_signal)


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (held open together while
    choosing, so they differ)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def low_ports(n):
    """n distinct free ports below 32768, held together while choosing: out of
    the kernel's ephemeral range, so that no outgoing connection (a node's
    peer dials while the others start, a client's) takes one first, nor a
    killed node's port before it restarts."""
    socks, ports = [], []
    rng = random.Random()
    for _ in range(1000):
        if len(ports) == n:
            break
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", rng.randrange(20000, 32768)))
        except OSError:
            s.close()
            continue
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    check(len(ports) == n, "no %d free ports below 32768" % n)
    return ports


class Fail(Exception):
    pass


def wait_listening(port, nd, timeout=15):
    """Until 127.0.0.1:port takes a connection (node nd must stay up)."""
    deadline = time.time() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            check(nd.alive(), "the node exited: %s" % nd.log()[-2000:])
            check(time.time() < deadline, "nothing listens on %d" % port)
            time.sleep(0.05)


def one_node_test(prefix, body):
    """Runs body(tmp, hold) in a new directory tmp; the body puts the node it
    starts in hold[0]. Then that node must stop cleanly on SIGTERM (exit 0:
    under ASan, no leak or error). On a failure: FAIL and the node's log.
    Exits 0 or 1."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    hold, failed = [None], 0
    try:
        body(tmp, hold)
        nd, hold[0] = hold[0], None
        if nd is not None:
            rc = nd.term()
            check(rc == 0, "the node's exit status on SIGTERM: %d" % rc)
            print("ok   the node stopped cleanly", flush=True)
    except Exception as e:  # report, then the log
        failed = 1
        print("FAIL %s: %s" % (type(e).__name__, e), flush=True)
        if hold[0] is not None:
            print(hold[0].log()[-3000:])
    finally:
        if hold[0] is not None:
            hold[0].term()
        shutil.rmtree(tmp, True)
    sys.exit(failed)


def check(cond, msg):
    if not cond:
        raise Fail(msg)


class Node:
    def __init__(self, binary, node_id, args, logdir, env=None):
        self.binary = binary
        self.id = node_id
        self.args = args
        self.logdir = logdir
        self.env = env
        self.proc = None
        self.http_port = None
        self.starts = 0

    def start(self):
        self.starts += 1
        log = open(os.path.join(self.logdir, "n%d.log" % self.id), "ab")
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        self.proc = subprocess.Popen([self.binary] + self.args, stdout=log,
                                     stderr=subprocess.STDOUT, env=env)
        _procs.append(self.proc)
        log.close()

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=10)

    def term(self, timeout=15):
        """SIGTERM; returns the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log(self):
        try:
            with open(os.path.join(self.logdir, "n%d.log" % self.id), "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


def member_record_text(data):
    """A member record's value (GET /v1/kv/%01tierkv%2Fmember%2F<id>?raw) as the
    text "raft=... http=... removed=0|1 inc=...": the node writes a version byte
    (1) then a kvpb.MemberRecord (proto/kv.proto: raft = 1, http = 2,
    removed = 3, incarnation = 4); builds before it wrote that text itself."""
    if not data or data[0] != 1:
        return data.decode(errors="replace")
    f = {1: b"", 2: b"", 3: 0, 4: b""}
    i = 1

    def varint():
        nonlocal i
        v = shift = 0
        while True:
            b = data[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v

    while i < len(data):
        key = varint()
        if key & 7 == 0:
            f[key >> 3] = varint()
        elif key & 7 == 2:
            n = varint()
            f[key >> 3] = data[i:i + n]
            i += n
        else:
            raise ValueError("wire type %d in member record %r" % (key & 7, data))
    return "raft=%s http=%s removed=%d inc=%s" % (
        f[1].decode() or "-", f[2].decode() or "-", f[3], f[4].hex() or "-")


def request(port, method, path, body=None, headers=None, timeout=10):
    """One request on a fresh connection: (status, headers dict lower-case, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if isinstance(body, str):
            body = body.encode()
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


def jreq(port, method, path, obj=None, headers=None, timeout=10):
    h = dict(headers or {})
    body = None
    if obj is not None:
        body = json.dumps(obj).encode()
        h["Content-Type"] = "application/json"
    st, hd, data = request(port, method, path, body, h, timeout)
    try:
        js = json.loads(data) if data else None
    except ValueError:
        js = None
    return st, hd, js


def raw(port, data, timeout=5.0, until_close=False):
    """Sends raw bytes; returns what was read when the first complete response
    is in (or, with until_close, when the server closes), or when `timeout`
    passes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        if data:
            try:
                s.sendall(data)
            except OSError:
                pass  # the server may answer and close before reading it all
        out = b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, OSError):
                break
            if not chunk:
                break
            out += chunk
            if not until_close and complete(out):
                break
        return out
    finally:
        s.close()


def complete(resp):
    """True once resp holds at least one whole response."""
    end = resp.find(b"\r\n\r\n")
    if end < 0:
        return False
    n = 0
    for ln in resp[:end].split(b"\r\n")[1:]:
        k, _, v = ln.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v.strip())
    return len(resp) >= end + 4 + n


def parse_responses(resp):
    """[(status, headers dict lower-case, body)] of the HTTP responses in a raw
    byte string (Content-Length framed, as tierkvd sends them)."""
    out = []
    i = 0
    while i < len(resp):
        end = resp.find(b"\r\n\r\n", i)
        if end < 0 or not resp.startswith(b"HTTP/1.1 ", i):
            break
        lines = resp[i:end].split(b"\r\n")
        status = int(lines[0][9:12])
        hd = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            hd[k.strip().lower().decode()] = v.strip().decode()
        n = int(hd.get("content-length", "0"))
        out.append((status, hd, resp[end + 4:end + 4 + n]))
        i = end + 4 + n
    return out


def status_of(resp):
    """Status codes of every HTTP response in a raw byte string."""
    return [r[0] for r in parse_responses(resp)]


class Cluster:
    def __init__(self, binary, n=3, extra_args=None, tick_ms=10, election_ticks=20,
                 token=False):
        """token=True: every node gets --peer-token-file DIR/peer-token (0600),
        as `make run` starts them; self.token_args repeats it for joiners."""
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="tierkv-it-")
        if os.environ.get("TKCLUSTER_KEEP") != "1":  # 1: keep data and logs to read
            atexit.register(shutil.rmtree, self.dir, True)
        self.token_args = []
        if token:
            path = os.path.join(self.dir, "peer-token")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, os.urandom(32).hex().encode())
            os.close(fd)
            self.token_args = ["--peer-token-file", path]
            extra_args = list(extra_args or []) + self.token_args
        ports = free_ports(2 * n)
        self.raft_ports = ports[:n]
        self.http_ports = ports[n:]
        self.tick_ms = tick_ms
        self.election_ticks = election_ticks
        members = ",".join("%d=127.0.0.1:%d" % (i + 1, self.raft_ports[i]) for i in range(n))
        mhttp = ",".join("%d=127.0.0.1:%d" % (i + 1, self.http_ports[i]) for i in range(n))
        self.nodes = []
        for i in range(n):
            args = ["--id", str(i + 1), "--members", members, "--members-http", mhttp,
                    "--listen-http", "127.0.0.1:%d" % self.http_ports[i],
                    "--data-dir", os.path.join(self.dir, "n%d" % (i + 1)), "--store", "fs",
                    "--tick-ms", str(tick_ms), "--election-ticks", str(election_ticks),
                    "--kv-no-sync"] + list(extra_args or [])
            node = Node(binary, i + 1, args, self.dir)
            node.http_port = self.http_ports[i]
            self.nodes.append(node)

    def start(self):
        for nd in self.nodes:
            nd.start()

    def node(self, node_id):
        return self.nodes[node_id - 1]

    def status(self, nd, timeout=2):
        try:
            st, _, js = jreq(nd.http_port, "GET", "/v1/cluster", timeout=timeout)
            return js if st == 200 else None
        except (OSError, http.client.HTTPException):
            return None

    def wait_leader(self, timeout=15, exclude=()):
        """The id of a leader all live nodes agree on."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            live = [nd for nd in self.nodes if nd.alive() and nd.id not in exclude]
            sts = [self.status(nd) for nd in live]
            if all(sts):
                leaders = {s["leader"] for s in sts}
                lead = [s["id"] for s in sts if s["role"] == "leader"]
                if len(leaders) == 1 and len(lead) == 1 and lead[0] in leaders:
                    return lead[0]
            time.sleep(0.02)
        raise Fail("no leader within %ss; logs in %s" % (timeout, self.dir))

    def stop(self):
        codes = {}
        for nd in self.nodes:
            if nd.alive():
                codes[nd.id] = nd.term()
        return codes


def check_graceful_stop(cluster):
    """SIGTERM to every node: each must exit 0."""
    codes = cluster.stop()
    check(all(c == 0 for c in codes.values()), "exit codes %r" % codes)


def finish(cluster, failed):
    """After a failure, the tail of every node's log; then exit 1 if anything failed."""
    for nd in cluster.nodes:
        if failed and nd.log():
            sys.stdout.write("--- log of node %d (last 30 lines)\n" % nd.id)
            sys.stdout.write("\n".join(nd.log().splitlines()[-30:]) + "\n")
    sys.exit(1 if failed else 0)


def run(tests, *args):
    """Runs the test functions in order; prints one line each; exit 1 on failure."""
    failed = 0
    for t in tests:
        t0 = time.time()
        try:
            t(*args)
            print("ok   %-45s %.2fs" % (t.__name__, time.time() - t0), flush=True)
        except Exception as e:  # report and keep going
            failed += 1
            print("FAIL %-45s %s: %s" % (t.__name__, type(e).__name__, e), flush=True)
    return failed
