#!/usr/bin/env python3
"""--listen-client over TLS (etcdapi/grpc.c with tls/): one tierkvd with
--cert-file, --key-file and --client-ca-file, certificates made at test time
with the openssl CLI (tests/integration/tls_test.py's helpers: two CAs, a
server certificate, a client certificate from each CA).

- etcd-client -mode tls (tls.go, clientv3 v3.6.16): with the trusted client
  certificate Put, Get, a watch event and a lease work; refused: no client
  certificate, one of another CA, a client that does not trust the server's
  CA, and cleartext h2c.
- ALPN: a handshake offering h2 selects h2; one offering only http/1.1 is
  refused (no_application_protocol).
- etcdctl (Debian's 3.4, if installed) with --cacert/--cert/--key: put, get.
- Half-open handshakes: with --max-tls-handshakes-per-addr 4, of 10
  connections from 127.0.0.1 that begin a ClientHello and stop, 4 hold a slot
  and 6 are closed at accept; then 600 more such connections, opened and
  left while /healthz is asked: every answer comes (the node goes on), and
  once they close a real client is served again.

    etcd_tls_test.py TIERKVD ETCD_CLIENT [--no-client-ca]

--no-client-ca is the known-bad control (registered should_fail): the node
runs without --client-ca-file, so a client without a certificate is served
and the check that it is refused must fail.
"""
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import tkcluster as tk  # noqa: E402
import tls_test as certs  # noqa: E402  (make_ca, make_cert, f; TMP set below)

PER_ADDR = 4


def alpn_handshake(port, protos, cert=True):
    c = ssl.create_default_context(cafile=certs.f("caA.pem"))
    if cert:
        c.load_cert_chain(certs.f("cliA.pem"), certs.f("cliA.key"))
    c.set_alpn_protocols(protos)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with c.wrap_socket(raw, server_hostname="localhost") as s:
            return s.selected_alpn_protocol()


def https_healthz(port):
    c = ssl.create_default_context(cafile=certs.f("caA.pem"))
    c.load_cert_chain(certs.f("cliA.pem"), certs.f("cliA.key"))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with c.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                b = s.recv(4096)
                if not b:
                    break
                data += b
            return data.split(b" ", 2)[1] == b"200"


def run(tierkvd, client, tmp, hold):
    no_ca = "--no-client-ca" in sys.argv
    certs.TMP = tmp
    certs.make_ca("caA")
    certs.make_ca("caB")
    certs.make_cert("caA", "srv", "localhost")
    certs.make_cert("caA", "cliA", "client-a", san="DNS:client-a")
    certs.make_cert("caB", "cliB", "client-b", san="DNS:client-b")
    cport = tk.free_ports(1)[0]
    extra = ["--cert-file", certs.f("srv.pem"), "--key-file", certs.f("srv.key"),
             "--listen-client", "127.0.0.1:%d" % cport,
             "--max-tls-handshakes", "1024",
             "--max-tls-handshakes-per-addr", str(PER_ADDR)]
    if not no_ca:
        extra += ["--client-ca-file", certs.f("caA.pem")]
    nd = hold[0] = certs.start_node(tierkvd, extra, certs.ctx("caA", "cliA"))  # /readyz
    ep = "127.0.0.1:%d" % cport
    tk.wait_listening(cport, nd)  # the etcd listener comes up with the node's loop
    t0 = time.time()
    r = subprocess.run([client, "-mode", "tls", "-target", ep,
                        "-cacert", certs.f("caA.pem"), "-cert", certs.f("cliA.pem"),
                        "-key", certs.f("cliA.key"), "-other-cert", certs.f("cliB.pem"),
                        "-other-key", certs.f("cliB.key")], timeout=120)
    tk.check(r.returncode == 0, "etcd-client -mode tls failed (%d)" % r.returncode)
    print("ok   clientv3 over TLS (%.1fs)" % (time.time() - t0), flush=True)

    got = alpn_handshake(cport, ["h2", "http/1.1"])
    tk.check(got == "h2", "ALPN offering h2 selected %r" % got)
    try:
        got = alpn_handshake(cport, ["http/1.1"])
        raise tk.Fail("ALPN without h2 was served (%r)" % got)
    except (ssl.SSLError, OSError) as e:
        print("ok   ALPN h2 selected; a client offering only http/1.1 refused: %s" % e,
              flush=True)

    etcdctl = shutil.which("etcdctl")
    if etcdctl:
        env = dict(os.environ, ETCDCTL_API="3")
        base = [etcdctl, "--endpoints=https://" + ep, "--cacert", certs.f("caA.pem"),
                "--cert", certs.f("cliA.pem"), "--key", certs.f("cliA.key"),
                "--dial-timeout=5s", "--command-timeout=10s"]
        p = subprocess.run(base + ["put", "/tls/ctl", "by etcdctl"], env=env,
                           capture_output=True, text=True, timeout=60)
        tk.check(p.returncode == 0 and p.stdout.strip() == "OK",
                 "etcdctl put over TLS: %d %s %s" % (p.returncode, p.stdout, p.stderr))
        p = subprocess.run(base + ["get", "/tls/ctl", "--print-value-only"], env=env,
                           capture_output=True, text=True, timeout=60)
        tk.check(p.returncode == 0 and p.stdout.strip() == "by etcdctl",
                 "etcdctl get over TLS: %d %s %s" % (p.returncode, p.stdout, p.stderr))
        print("ok   etcdctl --cacert --cert --key: put, get", flush=True)

    socks = certs.half_open(cport, 10)
    closed = certs.closed_soon(socks, 10 - PER_ADDR)
    for s in socks:
        s.close()
    print("ok?  of 10 half-open handshakes from one address, %d closed at accept"
          % closed, flush=True)
    tk.check(closed == 10 - PER_ADDR, "closed %d of 10, want %d (%d held)"
             % (closed, 10 - PER_ADDR, PER_ADDR))

    # A storm: 600 connections that begin a handshake and stop, opened
    # while the node's HTTPS /healthz is asked after every 50.
    storm, worst = [], 0.0
    for i in range(600):
        try:
            s = socket.create_connection(("127.0.0.1", cport), timeout=5)
            s.sendall(b"\x16\x03\x01")
            storm.append(s)
        except OSError:
            pass  # refused at accept and reset: what the cap does
        if i % 50 == 49:
            t1 = time.time()
            tk.check(https_healthz(nd.http_port), "/healthz during the storm")
            worst = max(worst, time.time() - t1)
    tk.check(nd.alive(), "the node died in the handshake storm")
    for s in storm:
        s.close()
    print("ok   600 half-open handshakes: /healthz answered throughout "
          "(slowest %.0f ms)" % (worst * 1000), flush=True)
    deadline = time.time() + 10
    while True:  # the held slots go with their connections
        try:
            if alpn_handshake(cport, ["h2"]) == "h2":
                break
        except (ssl.SSLError, OSError):
            pass
        tk.check(time.time() < deadline, "no handshake after the storm left")
        time.sleep(0.1)
    print("ok   a real client is served once they left", flush=True)


def main():
    tierkvd, client = sys.argv[1], sys.argv[2]
    tk.one_node_test("tierkv-etcd-tls-", lambda tmp, hold: run(tierkvd, client, tmp, hold))


if __name__ == "__main__":
    main()
