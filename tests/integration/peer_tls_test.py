#!/usr/bin/env python3
"""Peer mutual TLS (issue 15): three tierkvd on loopback whose Raft links are
TLS with certificates made at test time (openssl CLI), each naming its member
as node-<id>.

Checks: the cluster elects a leader and replicates over mTLS (with and
without a cluster token beside it); a node whose certificate chains to
another CA is refused by its peers and never joins; a node whose certificate
(from the right CA) names another id is refused and never joins; so is one
whose certificate (right CA, right name) expired a day ago; the same node
restarted with its own certificate catches up.

usage: peer_tls_test.py path/to/tierkvd
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import Cluster, Fail, check, jreq, request  # noqa: E402

TMP = None


def sh(*args):
    p = subprocess.run(list(args), capture_output=True, timeout=60, cwd=TMP)
    if p.returncode != 0:
        raise Fail("%s: %s" % (" ".join(args), p.stderr.decode(errors="replace")))


def make_ca(name):
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
       "-nodes", "-keyout", name + ".key", "-out", name + ".pem", "-days", "2",
       "-subj", "/CN=" + name)


def make_cert(ca, name, dns, days=1):
    """A certificate for `dns` signed by `ca`; days=-1: it expired a day ago."""
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
       "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + dns)
    with open(os.path.join(TMP, name + ".ext"), "w") as f:
        f.write("subjectAltName=DNS:%s\n" % dns)
    sh("openssl", "x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey",
       ca + ".key", "-CAcreateserial", "-out", name + ".pem", "-days", str(days), "-extfile",
       name + ".ext")


def tls_args(cert, ca="caA"):
    return ["--peer-cert-file", os.path.join(TMP, cert + ".pem"), "--peer-key-file",
            os.path.join(TMP, cert + ".key"), "--peer-trusted-ca-file",
            os.path.join(TMP, ca + ".pem")]


def cluster_with(tierkvd, certs, extra=None):
    c = Cluster(tierkvd, 3, extra_args=extra)
    for nd, cert in zip(c.nodes, certs):
        nd.args += tls_args(cert)
    return c


def wait_value(c, nd, key, want, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            st, _, js = jreq(nd.http_port, "GET", "/v1/kv/%s?consistency=stale" % key,
                             timeout=2)
            if st == 200 and js["value"] == want:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def strangers(c, lead):
    """A stranger on the Raft port: plain bytes, and TLS without a client
    certificate. Both are closed and counted; the leader stays."""
    import socket
    import ssl
    port = c.raft_ports[lead - 1]
    before = metric(c.node(lead).http_port, "tierkv_transport_auth_failures_total")
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"\x58\x00\x00\x00" + b"\x00" * 92)  # a frame header and zeros
    try:
        closed = s.recv(100) == b""
    except OSError:
        closed = True
    s.close()
    check(closed, "plain bytes on an mTLS raft port were not closed")
    ctx = ssl.create_default_context(cafile=os.path.join(TMP, "caA.pem"))
    ctx.check_hostname = False
    refused = False
    try:
        t = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5))
        t.sendall(b"hello")
        refused = t.recv(100) == b""
    except (ssl.SSLError, OSError):
        refused = True
    check(refused, "TLS without a client certificate was served on the raft port")
    deadline = time.time() + 5
    while time.time() < deadline and metric(
            c.node(lead).http_port, "tierkv_transport_auth_failures_total") < before + 2:
        time.sleep(0.05)
    after = metric(c.node(lead).http_port, "tierkv_transport_auth_failures_total")
    check(after >= before + 2, "auth failures %s -> %s" % (before, after))
    check(c.wait_leader(timeout=5) == lead, "the leader changed after the strangers")


def test_good_cluster(tierkvd, extra, label):
    c = cluster_with(tierkvd, ["node1", "node2", "node3"], extra)
    try:
        c.start()
        t0 = time.time()
        lead = c.wait_leader(timeout=20)
        print("  %s: leader %d after %.2fs" % (label, lead, time.time() - t0))
        st, _, _ = request(c.node(lead).http_port, "PUT", "/v1/kv/k", b"over-mtls")
        check(st == 200, "PUT on the leader: %s" % st)
        for nd in c.nodes:
            check(wait_value(c, nd, "k", "over-mtls"), "node %d did not apply" % nd.id)
        if label == "mTLS":
            strangers(c, lead)
    finally:
        c.stop()


def metric(port, name):
    st, _, body = request(port, "GET", "/metrics")
    for ln in body.decode().splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[1])
    raise Fail("no %s on /metrics" % name)


def test_refused(tierkvd, cert3, want_log):
    """Node 3 with a bad certificate: 1 and 2 have a leader, 3 never gets
    the write; then 3 with its own certificate catches up."""
    c = cluster_with(tierkvd, ["node1", "node2", cert3])
    try:
        c.start()
        lead = c.wait_leader(timeout=20, exclude=(3,))
        st, _, _ = request(c.node(lead).http_port, "PUT", "/v1/kv/k2", b"members-only")
        check(st == 200, "PUT with two members: %s" % st)
        check(not wait_value(c, c.node(3), "k2", "members-only", timeout=3),
              "node 3 with %s got the write" % cert3)
        logs = c.node(1).log() + c.node(2).log() + c.node(3).log()
        check(want_log in logs, "no %r in the logs" % want_log)
        refusals = sum(metric(c.node(i).http_port, "tierkv_transport_auth_failures_total")
                       for i in (1, 2))
        check(refusals > 0, "no transport auth failure counted on /metrics")
        c.node(3).kill()
        c.node(3).args = c.node(3).args[:-6] + tls_args("node3")
        c.node(3).start()
        check(wait_value(c, c.node(3), "k2", "members-only", timeout=20),
              "node 3 with its own certificate did not catch up")
    finally:
        c.stop()


def main():
    global TMP
    import atexit
    import shutil
    import tempfile
    tierkvd = sys.argv[1]
    TMP = tempfile.mkdtemp(prefix="tierkv-ptls-")
    atexit.register(shutil.rmtree, TMP, True)
    make_ca("caA")
    make_ca("caB")
    for i in (1, 2, 3):
        make_cert("caA", "node%d" % i, "node-%d" % i)
    make_cert("caB", "node3b", "node-3")
    make_cert("caA", "node9", "node-9")
    make_cert("caA", "node3x", "node-3", days=-1)
    token = os.path.join(TMP, "token")
    with open(token, "w") as f:
        f.write("0123456789abcdef0123456789abcdef\n")
    os.chmod(token, 0o600)
    tests = [
        ("good mTLS cluster", lambda: test_good_cluster(tierkvd, None, "mTLS")),
        ("mTLS beside a token",
         lambda: test_good_cluster(tierkvd, ["--peer-token-file", token], "mTLS+token")),
        ("a certificate of another CA",
         lambda: test_refused(tierkvd, "node3b", "certificate verify failed")),
        ("a certificate naming another id",
         lambda: test_refused(tierkvd, "node9", "does not name the node id it claims")),
        ("an expired certificate (right CA, right name)",
         lambda: test_refused(tierkvd, "node3x", "certificate has expired")),
    ]
    failed = 0
    for name, fn in tests:
        t0 = time.time()
        try:
            fn()
            print("ok   %s (%.1fs)" % (name, time.time() - t0))
        except Exception as e:  # noqa: BLE001
            failed += 1
            print("FAIL %s: %s" % (name, e))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
