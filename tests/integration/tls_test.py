#!/usr/bin/env python3
"""HTTPS on the gateway (issue 15): certificates made at test time with the
openssl CLI (two CAs, a server certificate, an expired one, client
certificates from each CA and an expired one), single-node tierkvd processes
on loopback, and every client we ship or trust (Python's ssl module, the
tierkv CLI, tierkv bench).

Checks: HTTPS works (keep-alive too); a client trusting another CA refuses
the server; an expired server certificate is refused; plain HTTP on the
HTTPS port gets no answer and does not hurt the server; a partial TLS record
holds nothing (another client is served meanwhile); with --client-ca-file a
client certificate is required, and one from another CA or expired is
refused; tierkvd refuses bad certificate flags at start.

usage: tls_test.py path/to/tierkvd path/to/tierkv
"""
import json
import os
import socket
import ssl
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import Fail, Node, check, free_ports  # noqa: E402

TMP = None


def sh(*args):
    p = subprocess.run(list(args), capture_output=True, timeout=60, cwd=TMP)
    if p.returncode != 0:
        raise Fail("%s: %s" % (" ".join(args), p.stderr.decode(errors="replace")))


def make_ca(name):
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
       "-nodes", "-keyout", name + ".key", "-out", name + ".pem", "-days", "2",
       "-subj", "/CN=" + name)


def make_cert(ca, name, cn, days="1", san="DNS:localhost,IP:127.0.0.1"):
    """A leaf signed by `ca`; days "-1" makes it expired."""
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
       "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn)
    with open(os.path.join(TMP, name + ".ext"), "w") as f:
        f.write("subjectAltName=%s\n" % san)
    sh("openssl", "x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey",
       ca + ".key", "-CAcreateserial", "-out", name + ".pem", "-days", days,
       "-extfile", name + ".ext")


def f(name):
    return os.path.join(TMP, name)


def start_node(binary, extra, ready_ctx=None):
    port = free_ports(1)[0]
    args = ["--store", "mem", "--listen-http", "127.0.0.1:%d" % port] + extra
    nd = Node(binary, port, args, TMP)
    nd.http_port = port
    nd.start()
    deadline = time.time() + 15
    while time.time() < deadline:
        check(nd.alive(), "tierkvd exited: %s" % nd.log()[-2000:])
        try:
            if ready_ctx is None:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return nd
            if https(port, ready_ctx, "GET", "/readyz")[0][0] == 200:
                return nd
        except (OSError, ssl.SSLError):
            pass
        time.sleep(0.05)
    raise Fail("tierkvd did not listen on %d" % port)


def closed_soon(socks, want, timeout=5):
    """How many of socks the server closed: polled until `want` are, or
    `timeout`; then a last look after 0.3 s (one more closed then would be a
    connection the cap should have held)."""
    gone = set()

    def look():
        for i, sk in enumerate(socks):
            if i in gone:
                continue
            sk.setblocking(False)
            try:
                if sk.recv(64) == b"":
                    gone.add(i)
            except BlockingIOError:
                pass
            except OSError:
                gone.add(i)
    deadline = time.time() + timeout
    while len(gone) < want and time.time() < deadline:
        look()
        time.sleep(0.05)
    time.sleep(0.3)
    look()
    return len(gone)


def half_open(port, n):
    """n connections to port that each send a TLS record header and stop: a
    handshake begun, never finished."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"\x16\x03\x01")  # a record header: a handshake begins
        socks.append(s)
    return socks


def ctx(ca, cert=None):
    c = ssl.create_default_context(cafile=f(ca + ".pem"))
    if cert:
        c.load_cert_chain(f(cert + ".pem"), f(cert + ".key"))
    return c


def https(port, context, method, path, body=None, host="127.0.0.1"):
    """Two requests on one connection when method is GET twice: returns the
    list of (status, body)."""
    import http.client
    c = http.client.HTTPSConnection(host, port, context=context, timeout=10)
    try:
        out = []
        for m in method.split("+"):
            c.request(m, path, body=body if m == "PUT" else None)
            r = c.getresponse()
            out.append((r.status, r.read()))
        return out
    finally:
        c.close()


def refused(port, context, host="127.0.0.1"):
    """The reason a request fails, or None if it got an answer."""
    try:
        https(port, context, "GET", "/v1/kv/k", host=host)
        return None
    except (ssl.SSLError, OSError) as e:
        return repr(e)


def cli(tierkv, port, *args, scheme=""):
    p = subprocess.run([tierkv, "-e", "%s127.0.0.1:%d" % (scheme, port), "--retries", "0",
                        "--timeout", "5s"] + list(args), capture_output=True, timeout=60)
    return p.returncode, (p.stdout + p.stderr).decode(errors="replace")


def test_https_and_wrong_ca(tierkvd, tierkv):
    nd = start_node(tierkvd, ["--cert-file", f("srv.pem"), "--key-file", f("srv.key")],
                    ctx("caA"))
    port = nd.http_port
    r = https(port, ctx("caA"), "PUT", "/v1/kv/k", body=b"hello")
    check(r[0][0] == 200, "PUT over HTTPS: %r" % r)
    r = https(port, ctx("caA"), "GET+GET", "/v1/kv/k", host="localhost")
    check([s for s, _ in r] == [200, 200] and json.loads(r[1][1])["value"] == "hello",
          "two GETs on one HTTPS connection: %r" % r)
    why = refused(port, ctx("caB"))
    check(why is not None and "CERTIFICATE_VERIFY_FAILED" in why,
          "a client trusting another CA must refuse the server: %s" % why)
    rc, out = cli(tierkv, port, "--cacert", f("caA.pem"), "get", "k")
    check(rc == 0 and "hello" in out, "tierkv --cacert get: rc %d %s" % (rc, out))
    rc, out = cli(tierkv, port, "--cacert", f("caA.pem"), "put", "k2", "v2", scheme="https://")
    check(rc == 0, "tierkv https:// put: rc %d %s" % (rc, out))
    rc, out = cli(tierkv, port, "--cacert", f("caB.pem"), "get", "k")
    check(rc == 5 and "certificate verify failed" in out,
          "tierkv trusting another CA: rc %d %s" % (rc, out))
    rc, out = cli(tierkv, port, "get", "k")
    check(rc != 0, "plain tierkv against HTTPS: rc %d %s" % (rc, out))
    # Plain HTTP on the HTTPS port: no HTTP answer, the connection closes.
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /v1/kv/k HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    s.close()
    check(b"HTTP/1.1" not in got and b"hello" not in got, "plain HTTP answered: %r" % got)
    # A partial record (a TLS header announcing 16 KiB, 3 bytes of it) holds
    # nothing: another client is served while it waits.
    hold = socket.create_connection(("127.0.0.1", port), timeout=5)
    hold.sendall(b"\x16\x03\x01\x40\x00\x01\x00\x3f")
    t0 = time.time()
    r = https(port, ctx("caA"), "GET", "/v1/kv/k")
    dt = time.time() - t0
    hold.close()
    print("  HTTPS request beside a partial record: %.1f ms" % (dt * 1000))
    check(r[0][0] == 200 and dt < 3.0, "served beside a partial record: %r in %.2fs" % (r, dt))
    # 300 pipelined requests in one TLS write (more than --max-pipeline, 64):
    # parsing pauses with decrypted bytes left over and resumes from them;
    # every answer comes back, in order.
    raw = ssl.create_default_context(cafile=f("caA.pem")).wrap_socket(
        socket.create_connection(("127.0.0.1", port), timeout=10),
        server_hostname="localhost")
    n = 300
    raw.sendall(b"".join(b"GET /v1/kv/k?x HTTP/1.1\r\nHost: a\r\n\r\n"
                         if i % 2 else b"GET /v1/kv/k HTTP/1.1\r\nHost: a\r\n\r\n"
                         for i in range(n)))
    got = b""
    deadline = time.time() + 20
    while got.count(b"HTTP/1.1 ") < n and time.time() < deadline:
        chunk = raw.recv(65536)
        if not chunk:
            break
        got += chunk
    raw.close()
    statuses = [int(x[:3]) for x in got.split(b"HTTP/1.1 ")[1:]]
    check(statuses == [400 if i % 2 else 200 for i in range(n)],
          "pipelined over HTTPS: %d answers, first wrong at %s" % (
              len(statuses), next((i for i, st in enumerate(statuses)
                                   if st != (400 if i % 2 else 200)), None)))
    # tierkv bench over HTTPS: nonzero throughput, no errors.
    p = subprocess.run([tierkv, "-e", "127.0.0.1:%d" % port, "--cacert", f("caA.pem"),
                        "bench", "--duration", "1s", "--warmup", "0", "--connections",
                        "4", "--keys", "100"], capture_output=True, timeout=60)
    out = p.stdout.decode(errors="replace")
    rows = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    check(p.returncode == 0 and rows and rows[-1]["ops"] > 0 and rows[-1]["errors"] == 0,
          "bench over HTTPS: rc %d %s %s" % (p.returncode, out, p.stderr.decode()))
    print("  bench over HTTPS: %.0f ops/s" % rows[-1]["ops_per_s"])
    r = https(port, ctx("caA"), "GET", "/metrics")
    fails = [ln for ln in r[0][1].decode().splitlines()
             if ln.startswith("tierkv_http_tls_failures_total ")]
    check(fails and float(fails[0].split()[1]) >= 2, "tls failures on /metrics: %r" % fails)
    check(nd.alive(), "tierkvd died")
    check(nd.term() == 0, "tierkvd did not stop cleanly")


def test_expired_server_cert(tierkvd, tierkv):
    nd = start_node(tierkvd, ["--cert-file", f("old.pem"), "--key-file", f("old.key")])
    why = refused(nd.http_port, ctx("caA"))
    check(why is not None and "expired" in why, "expired server certificate: %s" % why)
    rc, out = cli(tierkv, nd.http_port, "--cacert", f("caA.pem"), "get", "k")
    check(rc == 5 and "expired" in out, "tierkv vs an expired certificate: rc %d %s" % (rc, out))
    nd.term()


def test_client_certificates(tierkvd, tierkv):
    nd = start_node(tierkvd, ["--cert-file", f("srv.pem"), "--key-file", f("srv.key"),
                              "--client-ca-file", f("caA.pem")], ctx("caA", "cliA"))
    port = nd.http_port
    r = https(port, ctx("caA", "cliA"), "PUT", "/v1/kv/c", body=b"x")
    check(r[0][0] == 200, "client certificate of the trusted CA: %r" % r)
    for name, c, want in (("no client certificate", ctx("caA"), "CERTIFICATE_REQUIRED"),
                          ("a client certificate of another CA", ctx("caA", "cliB"),
                           "UNKNOWN_CA"),
                          ("an expired client certificate", ctx("caA", "cliOld"),
                           "EXPIRED")):
        why = refused(port, c)
        check(why is not None and want in why, "%s: %s" % (name, why))
        print("  refused %s: %s" % (name, why[:100]))
    rc, out = cli(tierkv, port, "--cacert", f("caA.pem"), "--cert", f("cliA.pem"), "--key",
                  f("cliA.key"), "get", "c")
    check(rc == 0, "tierkv --cert --key: rc %d %s" % (rc, out))
    rc, out = cli(tierkv, port, "--cacert", f("caA.pem"), "get", "c")
    check(rc != 0, "tierkv without a client certificate: rc %d %s" % (rc, out))
    check(nd.alive(), "tierkvd died")
    nd.term()


def test_handshake_caps(tierkvd, tierkv):
    """--max-tls-handshakes-per-addr 2: of 6 connections from 127.0.0.1 that
    start a ClientHello and stop, 2 hold a handshake slot and the others are
    closed at accept; once they go, a real client gets its answer."""
    nd = start_node(tierkvd, ["--cert-file", f("srv.pem"), "--key-file", f("srv.key"),
                              "--max-tls-handshakes", "8",
                              "--max-tls-handshakes-per-addr", "2"], ctx("caA"))
    port = nd.http_port
    socks = half_open(port, 6)
    # The refused ones are closed at once; the held ones answer nothing until
    # their deadline (--header-timeout-ms, 10 s).
    closed = closed_soon(socks, 4)
    for s in socks:
        s.close()
    print("  of 6 half-open handshakes from one address, %d closed at accept" % closed)
    check(closed == 4, "closed %d of 6, want 4 (2 held)" % closed)
    r = None
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            r = https(port, ctx("caA"), "GET", "/metrics")
            break
        except (ssl.SSLError, OSError):
            time.sleep(0.1)  # the held slots go with their connections
    check(r is not None and r[0][0] == 200, "metrics after the half-open ones left: %r" % r)
    line = [ln for ln in r[0][1].decode().splitlines()
            if ln.startswith("tierkv_http_tls_refused_total")]
    check(line and float(line[0].split()[1]) >= 4, "refused count: %r" % line)
    nd.term()


def test_bad_flags(tierkvd, tierkv):
    cases = [
        (["--cert-file", f("srv.pem")], "--key-file"),
        (["--key-file", f("srv.key")], "--cert-file"),
        (["--cert-file", f("srv.pem"), "--key-file", f("cliA.key")], "mismatch"),
        (["--cert-file", f("nothere.pem"), "--key-file", f("srv.key")], "nothere.pem"),
        (["--cert-file", f("srv.pem"), "--key-file", f("srv.key"), "--client-ca-file",
          f("nothere.pem")], "nothere.pem"),
    ]
    for args, want in cases:
        p = subprocess.run([tierkvd, "--store", "mem", "--listen-http", "127.0.0.1:0"] + args,
                           capture_output=True, timeout=20)
        out = (p.stdout + p.stderr).decode(errors="replace")
        check(p.returncode == 2 and want in out, "%r: rc %d %s" % (args, p.returncode, out))
    rc, out = cli(tierkv, 1, "--cacert", f("nothere.pem"), "get", "k")
    check(rc == 2 and "nothere.pem" in out, "tierkv --cacert missing: rc %d %s" % (rc, out))


def main():
    global TMP
    import tempfile
    import shutil
    import atexit
    tierkvd, tierkv = sys.argv[1], sys.argv[2]
    TMP = tempfile.mkdtemp(prefix="tierkv-tls-")
    atexit.register(shutil.rmtree, TMP, True)
    make_ca("caA")
    make_ca("caB")
    make_cert("caA", "srv", "localhost")
    make_cert("caA", "old", "localhost", days="-1")
    make_cert("caA", "cliA", "client-a", san="DNS:client-a")
    make_cert("caB", "cliB", "client-b", san="DNS:client-b")
    make_cert("caA", "cliOld", "client-old", days="-1", san="DNS:client-old")
    failed = 0
    for t in (test_https_and_wrong_ca, test_expired_server_cert, test_client_certificates,
              test_handshake_caps, test_bad_flags):
        t0 = time.time()
        try:
            t(tierkvd, tierkv)
            print("ok   %s (%.1fs)" % (t.__name__, time.time() - t0))
        except Exception as e:  # noqa: BLE001 - report and go on
            failed += 1
            print("FAIL %s: %s" % (t.__name__, e))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
