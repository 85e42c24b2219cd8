#!/usr/bin/env python3
"""The Raft port under attack (issue 49, "Done when"): two three-node clusters,
one started as `make run` starts it (scripts/run-cluster.sh: the same 0600
--peer-token-file for every node, made as the script makes it) and one with
peer mutual TLS (certificates naming node-<id>, made by the openssl CLI, no
token), each loaded with 200 keys and then attacked from this process, which
speaks the wire format itself (transport/transport_internal.h: frames
[u32 len][u32 crc32c][payload], handshake v4, the proofs of auth.c; the
RaftMessage and Forward shapes of proto/tierkv.proto by a tiny encoder):

 1. forged refusal: a follower stopped, its Raft port answered by the test
    with a HELLO of its id (junk proof; or the token flag flipped) and a
    REFUSE with a zero proof (in the clear under mTLS): the dialers must
    ignore it (no "not a member"), keep serving, and the follower rejoins;
 2. boundary terms (2^62-1, 2^62, 2^62+1, 2^63, 2^64-2^32-1, 2^64-1) in
    AppendEntries, RequestVote and TimeoutNow from a follower's id to the
    leader: a stranger is refused at the handshake; an insider (the token, or
    a member's certificate) gets through, and the raft guard refuses them
    (tierkv_raft_terms_refused_total counts them, the term stays);
 3. a flood of ~10k connections/s (a child process: non-blocking connects, at
    most 200 open, half silent, half sending 4 bytes, closed with a reset) on
    the leader's port for 3 s while a client writes and a follower restarts:
    no leader change, every write succeeds, the follower's handshakes to the
    leader complete during the flood (a linearizable read on it succeeds);
 4. a spoofed TimeoutNow to a follower claiming the leader's id: refused,
    leadership stays;
 5. a FORWARD frame injecting a write, to the leader claiming a follower's
    id: refused at the handshake, the key does not exist;
 6. a garbage snapshot: a stranger's is refused at the handshake; an
    insider's (claiming the leader's id and term) is refused by the follower's
    check (tierkv_snapshots_refused_total counts it), never storage_failed.
After each attack: a leader within 2 s of its end (polled, the time printed),
every key written so far read back with its value from every node
(linearizable scans and gets), the attack's effect absent, writes succeed.

Known-bad cases: the key check must reject a wrong value and a missing key;
and, as an insider, the same encoder's messages do take effect when they are
legitimate (a TimeoutNow of the current term moves leadership, an
AppendEntries of term + 1 moves the term, a FORWARD frame writes its key), so
the attacks' "nothing happened" means refused, not malformed.

usage: peer_attack_test.py path/to/tierkvd
"""
import hashlib
import hmac
import http.client
import json
import os
import random
import select
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import Cluster, Fail, check, jreq, request  # noqa: E402

# ---- wire format (transport/transport_internal.h, frame.c, auth.c) ----

KIND_HELLO, KIND_RAFT, KIND_FORWARD, KIND_AUTH = 1, 2, 3, 4
KIND_PING, KIND_WELCOME, KIND_REFUSE = 5, 6, 7
HELLO_MAGIC = 0x564B4B54
HELLO_VERSION = 4
HELLO_BYTES = 24 + 32 + 32 + 16
PROOF_OFF = 24 + 32
F_TOKEN = 0x1
AUTH_CONTEXT = b"tierkv-peer-auth-v4"


def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


CRC_TABLE = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def frame(payload):
    return struct.pack("<II", len(payload), crc32c(payload)) + payload


def hello_body(node_id, flags, proof=b"\0" * 32, nonce=None, cluster=1, inc=b"\0" * 16):
    nonce = os.urandom(32) if nonce is None else nonce
    return (struct.pack("<IHHQQ", HELLO_MAGIC, HELLO_VERSION, flags, cluster, node_id) +
            nonce + proof + inc)


def proof(token, label, hello_d, hello_a):
    """auth.c: HMAC-SHA256(token, context | label | both HELLO bodies, proofs zeroed)."""
    z = b"\0" * 32
    hd = hello_d[:PROOF_OFF] + z + hello_d[PROOF_OFF + 32:]
    ha = hello_a[:PROOF_OFF] + z + hello_a[PROOF_OFF + 32:]
    return hmac.new(token, AUTH_CONTEXT + bytes([label]) + hd + ha, hashlib.sha256).digest()


def parse_frames(buf):
    """(frames [(kind, body)], rest). Raises Fail on a CRC mismatch."""
    out = []
    while len(buf) >= 8:
        n, crc = struct.unpack_from("<II", buf)
        if len(buf) < 8 + n:
            break
        p = buf[8:8 + n]
        check(crc32c(p) == crc, "a frame from the node with a bad CRC")
        out.append((p[0], p[1:]))
        buf = buf[8 + n:]
    return out, buf


# ---- a tiny protobuf encoder (proto/tierkv.proto, proto/kv.proto) ----

def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_u64(no, v):
    return varint(no << 3) + varint(v) if v else b""


def f_bytes(no, b, always=False):
    return varint((no << 3) | 2) + varint(len(b)) + b if (b or always) else b""


def raft_msg(frm, to, term, body_no, body):
    """A FRAME_KIND_RAFT payload: RaftMessage{from, to, term, body}."""
    return bytes([KIND_RAFT]) + f_u64(1, frm) + f_u64(2, to) + f_u64(3, term) + f_bytes(
        body_no, body, always=True)


def m_vote(frm, to, term, last_index=1 << 20):
    return raft_msg(frm, to, term, 4, f_u64(1, last_index) + f_u64(2, term))


def m_append(frm, to, term, prev_index=0, prev_term=0, commit=0):
    return raft_msg(frm, to, term, 6, f_u64(1, prev_index) + f_u64(2, prev_term) +
                    f_u64(3, commit))


def m_timeout_now(frm, to, term):
    return raft_msg(frm, to, term, 9, b"")


def m_snapshot(frm, to, term, index, snap_term, voters, data):
    """One chunk holding the whole snapshot: offset 0, done, total = len(data)."""
    config = b"".join(f_u64(1, v) for v in voters)
    meta = f_u64(1, index) + f_u64(2, snap_term) + f_bytes(3, config, always=True)
    body = (f_bytes(1, meta, always=True) + f_u64(2, 0) + f_u64(3, 1) + f_bytes(4, data) +
            f_u64(5, len(data)))
    return raft_msg(frm, to, term, 8, body)


def m_forward_put(key, value):
    """A FRAME_KIND_FORWARD payload: Forward{request{id, token, mode, Command{put}}}."""
    put = f_bytes(1, key) + f_bytes(2, value)
    cmd = f_u64(1, random.getrandbits(63) | 1) + f_u64(2, 1) + f_bytes(3, put, always=True)
    req = f_u64(1, 7) + f_bytes(2, os.urandom(16)) + f_u64(3, 0) + f_bytes(4, cmd)
    return bytes([KIND_FORWARD]) + f_bytes(1, req, always=True)


BOUNDARY_TERMS = [(1 << 62) - 1, 1 << 62, (1 << 62) + 1, 1 << 63,
                  (1 << 64) - (1 << 32) - 1, (1 << 64) - 1]


# ---- a connection to a node's Raft port ----

class Peer:
    """Dials `port` claiming member `claim`. token: the cluster token (an
    insider) or None (a stranger: a junk AUTH); flags: the HELLO's flags;
    tls: an ssl.SSLContext (with or without a member's certificate)."""

    def __init__(self, port, claim, flags, token=None, tls=None):
        self.port, self.claim, self.flags, self.token = port, claim, flags, token
        self.tls = tls
        self.sock = None
        self.buf = b""
        self.frames = []
        self.closed = False
        self.hello_d = self.hello_a = None
        self.seen = []

    def connect(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=3)
        # No Nagle: TLS writes record by record, and a record held for the
        # receiver's delayed ACK (40 ms) loses the race with the real
        # member's redial, whose connection then replaces ours.
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            s = self.tls.wrap_socket(s, server_hostname="node-x")
        self.sock = s

    def send(self, data):
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.closed = True
            return False

    def read_frame(self, timeout):
        """The next frame (kind, body), or None when closed or on timeout."""
        deadline = time.time() + timeout
        while not self.frames and not self.closed and time.time() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.time()))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                break
            except (OSError, ssl.SSLError):
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self.buf += chunk
            try:
                got, self.buf = parse_frames(self.buf)
            except Fail:  # not frames (a TLS alert in the clear): not a welcome
                self.seen.append("non-frame bytes")
                self.buf = b""
                continue
            self.frames += got
        return self.frames.pop(0) if self.frames else None

    def wait_closed(self, timeout=5):
        """True once the node closed the connection (reading what comes)."""
        deadline = time.time() + timeout
        while not self.closed and time.time() < deadline:
            self.read_frame(deadline - time.time())
        return self.closed

    def handshake(self):
        """HELLO, the acceptor's HELLO, our AUTH (a proof, or junk without a
        token). Returns "welcome" (in), "refused" (closed before a WELCOME) or
        "open" (neither within 3 s). self.seen lists the kinds received."""
        try:
            self.connect()
        except (OSError, ssl.SSLError) as e:
            self.closed = True
            self.seen.append("connect: %s" % type(e).__name__)
            return "refused"
        self.hello_d = hello_body(self.claim, self.flags)
        if not self.send(frame(bytes([KIND_HELLO]) + self.hello_d)):
            return "refused"
        f = self.read_frame(3)
        if f is None:
            return "refused" if self.closed else "open"
        self.seen.append(f[0])
        if f[0] != KIND_HELLO or len(f[1]) != HELLO_BYTES:
            return "refused"
        self.hello_a = f[1]
        if self.token is not None:
            want = proof(self.token, ord("A"), self.hello_d, self.hello_a)
            check(f[1][PROOF_OFF:PROOF_OFF + 32] == want,
                  "the acceptor's HELLO proof does not match auth.c's formula as written "
                  "here (the test's HMAC is wrong)")
            auth = proof(self.token, ord("D"), self.hello_d, self.hello_a)
        else:
            auth = os.urandom(32) if self.flags & F_TOKEN else b"\0" * 32
        if not self.send(frame(bytes([KIND_AUTH]) + auth)):
            return "refused"
        f = self.read_frame(3)
        if f is None:
            return "refused" if self.closed else "open"
        self.seen.append(f[0])
        if f[0] == KIND_WELCOME:
            if self.token is not None:
                check(f[1] == proof(self.token, ord("W"), self.hello_d, self.hello_a),
                      "the WELCOME's proof does not check")
            return "welcome"
        return "refused"

    def close(self):
        try:
            self.sock.close()
        except (OSError, AttributeError):
            pass


def stranger_attack(port, claim, frames_, token_flag, tls_mode, ca=None):
    """A stranger's attempts to deliver frames_ to the node at port, claiming
    member `claim`: without the token (flags as a member's, a junk AUTH; and
    with the flag cleared), or under mTLS in the clear and as TLS without a
    client certificate. Every attempt must be closed without a WELCOME.
    Returns a short description of what it got."""
    variants = []
    if tls_mode:
        variants.append(("plain TCP", dict(flags=0, tls=None)))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.load_verify_locations(ca)
        variants.append(("TLS without a client certificate", dict(flags=0, tls=ctx)))
    else:
        variants.append(("junk AUTH", dict(flags=F_TOKEN if token_flag else 0)))
        variants.append(("token flag cleared", dict(flags=0)))
    got = []
    wire = b"".join(frame(f) for f in frames_)
    for name, kw in variants:
        p = Peer(port, claim, **kw)
        verdict = p.handshake()
        check(verdict != "welcome", "a stranger (%s) claiming %d got a WELCOME" % (name, claim))
        p.send(wire)  # whatever it was told, it sends its frames anyway
        closed = p.wait_closed(5)
        p.close()
        check(closed, "the node did not close a stranger's connection (%s) within 5 s" % name)
        got.append("%s: closed after %s" % (
            name, "+".join(k if isinstance(k, str) else {1: "HELLO", 7: "REFUSE"}.get(k, str(k))
                           for k in p.seen) or "nothing"))
    return "; ".join(got)


# ---- the cluster ----

class Setup:
    """A three-node cluster in mode "token" (as make run starts it) or "mtls"."""

    def __init__(self, tierkvd, mode, tmp):
        self.mode = mode
        self.tmp = tmp
        c = Cluster(tierkvd, 3)
        members = ",".join("%d=127.0.0.1:%d" % (i + 1, c.raft_ports[i]) for i in range(3))
        mhttp = ",".join("%d=127.0.0.1:%d" % (i + 1, c.http_ports[i]) for i in range(3))
        self.token = None
        if mode == "token":
            # As scripts/run-cluster.sh: 32 random bytes as hex, 0600, no newline.
            path = os.path.join(c.dir, "peer-token")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, os.urandom(32).hex().encode())
            os.close(fd)
            with open(path, "rb") as f:
                self.token = f.read().strip()
            sec = ["--peer-token-file", path]
        for nd in c.nodes:
            # scripts/run-cluster.sh's command line, with our ports and dirs.
            nd.args = ["--id", str(nd.id), "--members", members, "--members-http", mhttp,
                       "--listen-http", "127.0.0.1:%d" % nd.http_port,
                       "--data-dir", os.path.join(c.dir, "n%d" % nd.id), "--store", "fs"]
            if mode == "token":
                nd.args += sec
            else:
                nd.args += ["--peer-cert-file", os.path.join(tmp, "node%d.pem" % nd.id),
                            "--peer-key-file", os.path.join(tmp, "node%d.key" % nd.id),
                            "--peer-trusted-ca-file", os.path.join(tmp, "ca.pem")]
        self.c = c
        self.expected = {}
        self.absent = set()
        self.seq = 0

    def port(self, node_id):
        return self.c.raft_ports[node_id - 1]

    def http(self, node_id):
        return self.c.node(node_id).http_port

    def insider(self, port, claim):
        """An insider's connection (the token, or the claimed member's own
        certificate), past the handshake."""
        if self.mode == "token":
            p = Peer(port, claim, F_TOKEN, token=self.token)
        else:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.load_verify_locations(os.path.join(self.tmp, "ca.pem"))
            ctx.load_cert_chain(os.path.join(self.tmp, "node%d.pem" % claim),
                                os.path.join(self.tmp, "node%d.key" % claim))
            p = Peer(port, claim, 0, tls=ctx)
        v = p.handshake()
        check(v == "welcome", "an insider claiming %d was not welcomed (%s, got %s)" %
              (claim, v, p.seen))
        return p

    def stranger(self, port, claim, frames_):
        return stranger_attack(port, claim, frames_, True, self.mode == "mtls",
                               os.path.join(self.tmp, "ca.pem"))

    # -- state --

    def status(self, node_id):
        return self.c.status(self.c.node(node_id))

    def leader_term(self):
        lead = self.c.wait_leader(timeout=10)
        return lead, self.status(lead)["term"]

    def followers(self, lead):
        return [i for i in (1, 2, 3) if i != lead]

    def put(self, node_id, key, value, timeout=5):
        st, _, body = request(self.http(node_id), "PUT", "/v1/kv/" + key, value,
                              timeout=timeout)
        check(st == 200, "PUT %s on node %d: %s %s" % (key, node_id, st, body[:200]))
        self.expected[key] = value

    def write_some(self, n, label):
        lead = self.c.wait_leader(timeout=5)
        for i in range(n):
            nd = (lead, self.followers(lead)[i % 2])[i % 2]  # the leader and forwarded
            self.seq += 1
            self.put(nd, "pa/%s-%04d" % (label, self.seq), "v%d-%s" % (self.seq, label))

    def scan(self, node_id):
        st, _, js = jreq(self.http(node_id), "GET", "/v1/kv?prefix=pa/&limit=10000",
                         timeout=5)
        if st != 200:
            return None, "scan: %s %s" % (st, js)
        check(not js.get("more"), "the scan was cut short")
        return {it["key"]: it["value"] for it in js["items"]}, None

    def verify(self, why, timeout=10):
        """Every node answers every key with its value (linearizable scan,
        and a linearizable GET of a sample), and the absent keys are 404."""
        nodes = [nd.id for nd in self.c.nodes if nd.alive()]
        keys = sorted(self.expected)
        sample = random.sample(keys, min(12, len(keys)))
        for i in nodes:
            deadline = time.time() + timeout
            last = None
            while True:
                try:
                    got, err = self.scan(i)
                except (OSError, http.client.HTTPException) as e:
                    got, err = None, str(e)
                if got is not None:
                    break
                last = err
                if time.time() > deadline:
                    raise Fail("%s: node %d does not answer a linearizable scan: %s" %
                               (why, i, last))
                time.sleep(0.05)
            missing = [k for k in keys if k not in got]
            wrong = [k for k in keys if k in got and got[k] != self.expected[k]]
            extra = [k for k in got if k not in self.expected]
            check(not missing and not wrong and not extra,
                  "%s: node %d: %d missing (%s), %d wrong (%s), %d unexpected (%s)" %
                  (why, i, len(missing), missing[:3], len(wrong), wrong[:3], len(extra),
                   extra[:3]))
            for k in sample:
                st, _, js = jreq(self.http(i), "GET", "/v1/kv/" + k, timeout=5)
                check(st == 200 and js["value"] == self.expected[k],
                      "%s: node %d: GET %s: %s %s" % (why, i, k, st, js))
            for k in self.absent:
                st, _, js = jreq(self.http(i), "GET", "/v1/kv/" + k, timeout=5)
                check(st == 404, "%s: node %d: the injected key %s exists: %s %s" %
                      (why, i, k, st, js))

    def ready(self, node_id):
        try:
            st, _, js = jreq(self.http(node_id), "GET", "/readyz", timeout=2)
        except (OSError, http.client.HTTPException):
            return None
        return "ready" if st == 200 else (js or {}).get("error", str(st))

    def check_ready(self, node_id, timeout=5):
        """/readyz 200 within timeout; never storage_failed or not_a_member."""
        deadline = time.time() + timeout
        while True:
            r = self.ready(node_id)
            check(r not in ("storage_failed", "not_a_member"),
                  "node %d /readyz: %s" % (node_id, r))
            if r == "ready":
                return
            check(time.time() < deadline, "node %d /readyz: %s after %ss" %
                  (node_id, r, timeout))
            time.sleep(0.05)

    def leader_within(self, t_end, exclude=()):
        """A leader all live nodes (but `exclude`) agree on, within 2 s of t_end."""
        try:
            lead = self.c.wait_leader(timeout=max(0.05, t_end + 2.0 - time.time()),
                                      exclude=exclude)
        except Fail:
            raise Fail("no leader within 2 s of the attack's end")
        return lead, (time.time() - t_end) * 1000

    def metric(self, node_id, name):
        st, _, body = request(self.http(node_id), "GET", "/metrics", timeout=5)
        for ln in body.decode().splitlines():
            if ln.startswith(name + " "):
                return float(ln.split()[1])
        return None

    def stable(self, lead, term, window=1.0):
        """Leader and term unchanged on every live node for `window` seconds
        (what a TimeoutNow or a term would move within one election)."""
        deadline = time.time() + window
        while time.time() < deadline:
            for nd in self.c.nodes:
                if not nd.alive():
                    continue
                s = self.c.status(nd)
                if s is None:
                    continue
                if s["term"] != term or (s["leader"] not in (0, lead)):
                    return False, "node %d: leader %d term %d (was %d in %d)" % (
                        nd.id, s["leader"], s["term"], lead, term)
            time.sleep(0.03)
        return True, ""


def report(mode, name, outcome, ms, extra=""):
    print("[%s] attack %s: %s; leader after %.0f ms; keys intact%s" %
          (mode, name, outcome, ms, ("; " + extra) if extra else ""), flush=True)


# ---- the attacks ----

def attack_forged_refusal(s):
    lead, term = s.leader_term()
    victim = s.followers(lead)[-1]
    others = [i for i in (1, 2, 3) if i != victim]
    nd = s.c.node(victim)
    auth0 = {i: s.metric(i, "tierkv_transport_auth_failures_total") for i in others}
    check(nd.term() == 0, "node %d did not stop cleanly" % victim)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    deadline = time.time() + 10
    while True:
        try:
            ls.bind(("127.0.0.1", s.port(victim)))
            break
        except OSError:
            check(time.time() < deadline, "cannot listen on node %d's raft port" % victim)
            time.sleep(0.05)
    ls.listen(64)
    ls.setblocking(False)
    dials = []
    refusal_flags = [F_TOKEN if s.mode == "token" else 0, 0 if s.mode == "token" else F_TOKEN]
    forged = []
    for flags in refusal_flags:
        forged.append(frame(bytes([KIND_HELLO]) + hello_body(victim, flags, proof=os.urandom(32))) +
                      frame(bytes([KIND_REFUSE]) + b"\0" * 32))
    t0 = time.time()
    writes = 0
    bad_ready = []
    conns = []
    while time.time() - t0 < 2.0 or (len(dials) < 4 and time.time() - t0 < 6.0):
        r, _, _ = select.select([ls], [], [], 0.05)
        if r:
            try:
                cs, _ = ls.accept()
                cs.setblocking(True)
                cs.settimeout(0.5)
                try:
                    first = cs.recv(4096)  # the dialer's HELLO (or ClientHello)
                except OSError:
                    first = b""
                cs.sendall(forged[len(dials) % 2])
                dials.append(len(first))
                conns.append(cs)
            except OSError:
                pass
        # the others keep serving throughout
        if int((time.time() - t0) * 10) > writes:
            writes += 1
            s.seq += 1
            s.put(others[writes % 2], "pa/refusal-%04d" % s.seq, "during-%d" % s.seq)
            for i in others:
                rr = s.ready(i)
                if rr != "ready":
                    bad_ready.append((i, rr))
    for cs in conns:
        cs.close()
    ls.close()
    check(len(dials) >= 2, "only %d dials reached the forged listener" % len(dials))
    check(not [b for b in bad_ready if b[1] in ("not_a_member", "storage_failed")],
          "/readyz during the forged refusals: %s" % bad_ready)
    auth1 = {i: s.metric(i, "tierkv_transport_auth_failures_total") for i in others}
    check(any(auth1[i] > auth0[i] for i in others),
          "no dialer counted the forged refusal as an auth failure (%s -> %s)" % (auth0, auth1))
    nd.start()
    t_end = time.time()
    lead2, ms = s.leader_within(t_end, exclude=(victim,))
    for i in others:
        s.check_ready(i)
        check("refused this node" not in s.c.node(i).log(),
              "node %d believes it was refused:\n%s" % (i, s.c.node(i).log()[-2000:]))
    # the victim rejoins and catches up
    t1 = time.time()
    s.c.wait_leader(timeout=15)
    s.check_ready(victim, timeout=15)
    rejoin = time.time() - t1
    s.write_some(4, "after-refusal")
    s.verify("after the forged refusal")
    report(s.mode, "1 forged refusal", "ignored (%d dials answered with a forged HELLO + "
           "REFUSE; dialers' auth failures %s -> %s; none became not-a-member)" %
           (len(dials), sorted(auth0.values()), sorted(auth1.values())), ms,
           "node %d rejoined in %.2f s" % (victim, rejoin))


def boundary_frames(frm, to):
    out = []
    for t in BOUNDARY_TERMS:
        out += [m_append(frm, to, t, commit=1 << 40), m_vote(frm, to, t), m_timeout_now(frm, to, t)]
    return out


def attack_boundary_terms(s):
    lead, term = s.leader_term()
    f = s.followers(lead)[0]
    frames_ = boundary_frames(f, lead)
    ref0 = s.metric(lead, "tierkv_raft_terms_refused_total")
    got = s.stranger(s.port(lead), f, frames_)
    t_end = time.time()
    lead2, ms = s.leader_within(t_end)
    ok, why = s.stable(lead, term, 0.5)
    check(lead2 == lead and ok, "the leader or term moved after a stranger's terms: %s" % why)
    check(s.metric(lead, "tierkv_raft_terms_refused_total") == ref0,
          "a stranger's terms reached raft")
    # As an insider: the raft guard refuses them. All in one write right
    # after the WELCOME: the real follower, whose link ours replaced, redials
    # within tens of ms and its connection then replaces ours; if that cut
    # some off, the whole batch goes again (at most 3 times).
    batch = b"".join(frame(fr) for fr in frames_)
    for _ in range(3):
        p = s.insider(s.port(lead), f)
        check(p.send(batch),
              "the leader closed an insider's connection at once")
        deadline = time.time() + 2
        while (s.metric(lead, "tierkv_raft_terms_refused_total") < ref0 + len(frames_) and
               time.time() < deadline):
            time.sleep(0.02)
        p.close()
        if s.metric(lead, "tierkv_raft_terms_refused_total") >= ref0 + len(frames_):
            break
    n_ref = s.metric(lead, "tierkv_raft_terms_refused_total") - ref0
    check(n_ref >= len(frames_), "the leader counted %d of %d boundary-term messages as "
          "refused" % (n_ref, len(frames_)))
    t_end = time.time()
    lead3, ms2 = s.leader_within(t_end)
    terms = [s.status(i)["term"] for i in (1, 2, 3)]
    check(max(terms) < 1 << 32, "a term reached %d" % max(terms))
    ok, why = s.stable(lead3, s.status(lead3)["term"], 0.5)
    check(ok, "not settled after the insider's terms: %s" % why)
    s.write_some(4, "after-terms")
    s.verify("after the boundary terms")
    # Known-bad: an insider's AppendEntries of term + 1 does move the term,
    # so "the term stays" above is the guard, not a malformed message.
    lead4, term4 = s.leader_term()
    f4 = s.followers(lead4)[0]
    p = s.insider(s.port(lead4), f4)
    p.send(frame(m_append(f4, lead4, term4 + 1)))
    deadline = time.time() + 3
    while s.status(lead4)["term"] <= term4:
        check(time.time() < deadline, "control: an insider's term + 1 did not move the term: "
              "the encoder is wrong, the boundary check proves nothing")
        time.sleep(0.01)
    p.close()
    t_c = time.time()
    _, ms_c = s.leader_within(t_c)
    s.write_some(2, "after-control")
    report(s.mode, "2 boundary terms", "stranger refused at the handshake (%s); insider's %d "
           "messages refused by the raft guard (%d counted), terms stay %s" %
           (got, len(frames_), n_ref, terms), max(ms, ms2),
           "control: term + 1 from an insider moved the term, leader again after %.0f ms" % ms_c)


FLOOD_CHILD = r"""
import socket, struct, sys, time, errno, json
port, secs, rate, cap = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
linger = struct.pack("ii", 1, 0)
opened, sent, errs = 0, 0, 0
live = []
print("go", flush=True)
t0 = time.time()
end = t0 + secs
while True:
    now = time.time()
    if now >= end:
        break
    if opened >= (now - t0) * rate:
        time.sleep(0.0005)
        continue
    if len(live) >= cap:
        live.pop(0)[0].close()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
    s.setblocking(False)
    rc = s.connect_ex(("127.0.0.1", port))
    if rc not in (0, errno.EINPROGRESS):
        errs += 1
        s.close()
        continue
    opened += 1
    live.append([s, opened & 1])
    # Half send 4 bytes (a frame header's length): at once, or, if the
    # connect is still under way, once a few newer sockets have been opened.
    for e in (live[-1], live[-8] if len(live) >= 8 else None):
        if e is not None and e[1]:
            try:
                e[0].send(b"\x10\x00\x00\x00")
                e[1] = 0
                sent += 1
            except OSError:
                pass
for e in live:
    e[0].close()
el = time.time() - t0
print(json.dumps({"opened": opened, "sent": sent, "errors": errs, "secs": el}))
"""


def attack_flood(s):
    lead, term = s.leader_term()
    victim = s.followers(lead)[0]
    ev0 = s.metric(lead, "tierkv_transport_pending_evicted_total")
    log0 = {nd.id: len(nd.log()) for nd in s.c.nodes}
    child = subprocess.Popen([sys.executable, "-c", FLOOD_CHILD, str(s.port(lead)), "3.0",
                              "10000", "200"], stdout=subprocess.PIPE)
    lat, fails = [], []
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            i += 1
            k = "pa/flood-%05d" % i
            v = "f%d" % i
            t = time.time()
            try:
                st, _, _ = request(s.http(lead), "PUT", "/v1/kv/" + k, v, timeout=5)
            except (OSError, http.client.HTTPException) as e:
                st = str(e)
            lat.append(time.time() - t)
            if st == 200:
                s.expected[k] = v
            else:
                fails.append((k, st))

    w = threading.Thread(target=writer)
    t_start = time.time()
    w.start()
    rejoined = None
    try:
        check(child.stdout.readline().strip() == b"go", "the flood did not start")
        s.c.node(victim).kill()
        s.c.node(victim).start()
        t_restart = time.time()
        probe = sorted(s.expected)[0]
        while child.poll() is None:
            try:
                st, _, js = jreq(s.http(victim), "GET", "/v1/kv/" + probe, timeout=1)
            except (OSError, http.client.HTTPException):
                st = None
            if st == 200 and child.poll() is None:
                rejoined = time.time() - t_restart
                break
            time.sleep(0.05)
        out, _ = child.communicate(timeout=20)
    finally:
        stop.set()
        w.join(timeout=20)
        if child.poll() is None:
            child.kill()
            child.wait()
    t_end = time.time()
    stats = json.loads(out)
    rate = stats["opened"] / stats["secs"]
    lead2, ms = s.leader_within(t_end)
    # The nodes' own word on their loop (node.c logs a turn past the election
    # timeout): printed, so that a leader change is explained.
    for nd in s.c.nodes:
        for ln in nd.log()[log0[nd.id]:].splitlines():
            if 'msg="slow loop turn"' in ln:
                print("    node %d during the flood: %s" % (nd.id, ln[ln.find("msg="):][:400]))
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan")
    after = s.status(lead2) or {}
    print("    flood: %d connections in %.1f s (%.0f/s, %d with 4 bytes); %d writes, p99 %.1f "
          "ms, max %.1f ms, %d failed; leader %d term %d before, %d term %s after; node %d "
          "rejoined: %s" % (stats["opened"], stats["secs"], rate, stats["sent"], len(lat), p99,
                            lat[-1] * 1000 if lat else float("nan"), len(fails), lead, term,
                            lead2, after.get("term"), victim,
                            "%.2f s" % rejoined if rejoined is not None else "no"), flush=True)
    check(rejoined is not None,
          "node %d, restarted during the flood, never served a linearizable read "
          "(its handshakes to the leader did not complete) while the flood lasted" % victim)
    check(not fails, "%d writes failed during the flood: %s" % (len(fails), fails[:5]))
    check(lat, "no write completed during the flood")
    ok, why = s.stable(lead, term, 0.3)
    check(lead2 == lead and ok, "the leader changed during the flood: %s" % why)
    ev1 = s.metric(lead, "tierkv_transport_pending_evicted_total")
    s.write_some(4, "after-flood")
    s.verify("after the flood")
    report(s.mode, "3 connection flood", "absorbed (%d connections in %.1f s = %.0f/s, %d "
           "with 4 bytes; %d pending evicted); %d writes during it, p99 %.1f ms, max %.1f ms, "
           "none failed; no leader change" %
           (stats["opened"], stats["secs"], rate, stats["sent"], ev1 - ev0, len(lat), p99,
            lat[-1] * 1000), ms,
           "node %d restarted in the flood served a linearizable read %.2f s later" %
           (victim, rejoined))
    check(rate >= 5000, "the flood reached only %.0f connections/s (wanted ~10k)" % rate)


def attack_timeout_now(s):
    lead, term = s.leader_term()
    f = s.followers(lead)[0]
    got = s.stranger(s.port(f), lead, [m_timeout_now(lead, f, term)])
    t_end = time.time()
    lead2, ms = s.leader_within(t_end)
    ok, why = s.stable(lead, term, 1.0)
    check(lead2 == lead and ok, "a stranger's TimeoutNow moved leadership: %s" % why)
    s.write_some(4, "after-timeoutnow")
    s.verify("after the spoofed TimeoutNow")
    # Known-bad: the same TimeoutNow from an insider moves leadership.
    p = s.insider(s.port(f), lead)
    p.send(frame(m_timeout_now(lead, f, term)))
    deadline = time.time() + 3
    while True:
        st = s.status(f)
        if st and st["role"] == "leader":
            break
        check(time.time() < deadline, "control: an insider's TimeoutNow did not move "
              "leadership: the encoder is wrong, the check proves nothing")
        time.sleep(0.01)
    p.close()
    _, ms_c = s.leader_within(time.time())
    s.write_some(2, "after-tn-control")
    report(s.mode, "4 spoofed TimeoutNow", "refused at the handshake (%s); node %d still "
           "leads in term %d" % (got, lead, term), ms,
           "control: an insider's TimeoutNow made node %d leader" % f)


def attack_forward(s):
    lead, term = s.leader_term()
    f = s.followers(lead)[0]
    key = "pa/injected-%d" % random.getrandbits(32)
    s.absent.add(key)
    got = s.stranger(s.port(lead), f, [m_forward_put(key.encode(), b"pwned")])
    t_end = time.time()
    lead2, ms = s.leader_within(t_end)
    ok, why = s.stable(lead, term, 0.3)
    check(lead2 == lead and ok, "leader moved: %s" % why)
    s.write_some(4, "after-forward")
    s.verify("after the FORWARD injection")
    # Known-bad: an insider's FORWARD frame does write its key.
    ckey = "pa/ctl-forward-%d" % random.getrandbits(32)
    p = s.insider(s.port(lead), f)
    p.send(frame(m_forward_put(ckey.encode(), b"insider")))
    deadline = time.time() + 5
    while True:
        st, _, js = jreq(s.http(lead), "GET", "/v1/kv/" + ckey, timeout=2)
        if st == 200:
            break
        check(time.time() < deadline, "control: an insider's FORWARD frame wrote nothing: the "
              "encoder is wrong, the injection check proves nothing")
        time.sleep(0.02)
    p.close()
    s.expected[ckey] = "insider"
    report(s.mode, "5 FORWARD injection", "refused at the handshake (%s); %s does not exist" %
           (got, key), ms, "control: an insider's FORWARD wrote %s" % ckey)


def attack_snapshot(s):
    lead, term = s.leader_term()
    f = s.followers(lead)[0]
    st = s.status(f)
    garbage = os.urandom(64 << 10)
    snap = m_snapshot(lead, f, term, st["last_index"] + 1000, term, [1, 2, 3], garbage)
    ref0 = s.metric(f, "tierkv_snapshots_refused_total")
    got = s.stranger(s.port(f), lead, [snap])
    check(s.metric(f, "tierkv_snapshots_refused_total") == ref0,
          "a stranger's snapshot reached the node's check")
    t_end = time.time()
    lead2, ms = s.leader_within(t_end)
    # As an insider claiming the leader's id and term: the check refuses it.
    # The real leader redials within tens of ms (ours replaced its link) and
    # its connection replaces ours, dropping a reassembly under way: then the
    # snapshot goes again (at most 3 times).
    # (The frame is made first: its CRC in Python takes tens of ms, the
    # leader's redial less.)
    check(ref0 is not None, "no tierkv_snapshots_refused_total on /metrics")
    snap_frame = frame(snap)
    for _ in range(3):
        p = s.insider(s.port(f), lead)
        p.send(snap_frame)
        deadline = time.time() + 2
        while s.metric(f, "tierkv_snapshots_refused_total") <= ref0:
            r = s.ready(f)
            check(r != "storage_failed", "node %d: storage_failed after a garbage snapshot" % f)
            if time.time() > deadline:
                break
            time.sleep(0.02)
        p.close()
        if s.metric(f, "tierkv_snapshots_refused_total") > ref0:
            break
    check(s.metric(f, "tierkv_snapshots_refused_total") > ref0,
          "the follower did not count the garbage snapshot as refused (3 tries)")
    t_end = time.time()
    lead3, ms2 = s.leader_within(t_end)
    ref1 = s.metric(f, "tierkv_snapshots_refused_total")
    s.check_ready(f)
    st2 = s.status(f)
    check(st2 is not None and st2["snapshot_index"] < st["last_index"] + 1000,
          "the garbage snapshot's index was taken: %s" % st2)
    check("refused a snapshot" in s.c.node(f).log(), "no refusal line in node %d's log" % f)
    s.write_some(4, "after-snapshot")
    s.verify("after the garbage snapshot")
    s.check_ready(f)
    report(s.mode, "6 garbage snapshot", "stranger refused at the handshake (%s); insider's "
           "64 KiB of random bytes refused by node %d's check (snapshots_refused %d -> %d, "
           "/readyz ready, not storage_failed)" % (got, f, ref0, ref1), max(ms, ms2))


def self_test(s):
    """The key check rejects a wrong value, a missing key and an injected key."""
    k = sorted(s.expected)[0]
    good = s.expected[k]
    for name, change in [("a wrong value", lambda: s.expected.__setitem__(k, good + "x")),
                         ("a missing key", lambda: s.expected.__setitem__("pa/never", "x")),
                         ("an existing key as injected", lambda: s.absent.add(k))]:
        change()
        try:
            s.verify("self-test", timeout=1)
        except Fail as e:
            print("  ok: the key check rejects %s (%s)" % (name, str(e)[:90]))
        else:
            raise Fail("self-test: the key check accepted %s" % name)
        finally:
            s.expected[k] = good
            s.expected.pop("pa/never", None)
            s.absent.discard(k)
    check(crc32c(b"123456789") == 0xE3069283, "crc32c check value")


def run_config(tierkvd, mode, tmp):
    s = Setup(tierkvd, mode, tmp)
    t0 = time.time()
    failed = 0
    try:
        s.c.start()
        lead = s.c.wait_leader(timeout=20)
        for i in range(200):
            s.seq += 1
            s.put(lead if i % 4 else s.followers(lead)[i % 2], "pa/k%04d" % i,
                  "value-%d-%s" % (i, os.urandom(6).hex()))
        s.verify("after loading")
        print("[%s] 200 keys written and read back from every node (%.1fs)" %
              (mode, time.time() - t0), flush=True)
        self_test(s)
        for attack in (attack_forged_refusal, attack_boundary_terms, attack_flood,
                       attack_timeout_now, attack_forward, attack_snapshot):
            a0 = time.time()
            try:
                attack(s)
            except Exception as e:  # noqa: BLE001
                failed += 1
                print("[%s] FAIL %s: %s: %s" % (mode, attack.__name__, type(e).__name__, e),
                      flush=True)
                try:
                    s.c.wait_leader(timeout=10)
                except Fail:
                    break
            print("    (%s: %.1fs)" % (attack.__name__, time.time() - a0), flush=True)
        for nd in s.c.nodes:
            check(nd.alive(), "node %d died" % nd.id)
    except Exception as e:  # noqa: BLE001
        failed += 1
        print("[%s] FAIL: %s: %s" % (mode, type(e).__name__, e), flush=True)
    finally:
        if failed:
            n = int(os.environ.get("ATTACK_LOG_LINES", "25"))
            for nd in s.c.nodes:
                print("--- node %d log (last %d lines)" % (nd.id, n))
                print("\n".join(nd.log().splitlines()[-n:]))
        codes = s.c.stop()
        if any(c != 0 for c in codes.values()):
            print("[%s] FAIL: exit codes %s" % (mode, codes))
            failed += 1
    print("[%s] %s in %.1fs" % (mode, "ok" if not failed else "FAILED", time.time() - t0),
          flush=True)
    return failed


def make_certs(tmp):
    def sh(*args):
        p = subprocess.run(list(args), capture_output=True, timeout=60, cwd=tmp)
        if p.returncode != 0:
            raise Fail("%s: %s" % (" ".join(args), p.stderr.decode(errors="replace")))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    sh("openssl", "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
       "-subj", "/CN=attack-test-ca")
    for i in (1, 2, 3):
        n = "node%d" % i
        sh("openssl", "req", *ec, "-keyout", n + ".key", "-out", n + ".csr",
           "-subj", "/CN=node-%d" % i)
        with open(os.path.join(tmp, n + ".ext"), "w") as f:
            f.write("subjectAltName=DNS:node-%d\n" % i)
        sh("openssl", "x509", "-req", "-in", n + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
           "-CAcreateserial", "-out", n + ".pem", "-days", "1", "-extfile", n + ".ext")
        os.chmod(os.path.join(tmp, n + ".key"), 0o600)


def main():
    import atexit
    import shutil
    tierkvd = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="tierkv-attack-")
    atexit.register(shutil.rmtree, tmp, True)
    make_certs(tmp)
    modes = sys.argv[2:] or ["token", "mtls"]
    t0 = time.time()
    failed = sum(run_config(tierkvd, m, tmp) for m in modes)
    print("peer-attack: %s in %.1fs" % ("ok" if not failed else "FAIL", time.time() - t0))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
