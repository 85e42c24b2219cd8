#!/usr/bin/env python3
"""tierkvd's configuration checks: each bad setting exits 2 with a message
naming the flag (or its TIERKV_* variable); --help exits 0; a taken HTTP port
exits 1 with a message. Fast (no cluster): suite 'unit'.

usage: config_test.py path/to/tierkvd
"""
import os
import resource
import socket
import subprocess
import sys
import tempfile


def run(binary, args, env=None, timeout=20):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([binary] + args, capture_output=True, timeout=timeout, env=e)
    return p.returncode, (p.stdout + p.stderr).decode("utf-8", "replace")


def main():
    binary = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="tierkvd-cfg-")
    bad = [
        (["--members", "1=127.0.0.1"], {}, "--members"),
        (["--members", "x=127.0.0.1:7001"], {}, "positive node id"),
        (["--members", "1=127.0.0.1:7001,1=127.0.0.1:7002"], {}, "appears twice"),
        (["--id", "4", "--members", "1=127.0.0.1:7001,2=127.0.0.1:7002"], {}, "is not one of"),
        (["--id", "0"], {}, "--id"),
        (["--store", "disk"], {}, "--store"),
        (["--tick-ms", "fast"], {}, "--tick-ms"),
        (["--election-ticks", "2", "--heartbeat-ticks", "5"], {}, "--heartbeat-ticks"),
        (["--max-value-bytes", "2M"], {}, "--max-value-bytes"),
        (["--max-value-bytes", "12Q"], {}, "not a size"),
        (["--kv-ring-bytes", "64K"], {}, "--kv-ring-bytes"),
        (["--listen-http", "localhost"], {}, "--listen-http"),
        (["--log-level", "loud"], {}, "--log-level"),
        (["--log-format", "xml"], {}, "--log-format"),
        (["--bogus"], {}, "unknown flag"),
        (["--id"], {}, "needs a value"),
        ([], {"TIERKV_STORE": "tape"}, "--store"),
        ([], {"TIERKV_MEMBERS": "nonsense"}, "--members"),
        (["--members-http", "9=127.0.0.1:1"], {}, "--members-http"),
        (["--data-dir", "/proc/forbidden/dir"], {}, "--data-dir"),
        # Issue 19: a body over the raft frame limit could never be replicated.
        (["--max-body-bytes", "8M"], {},
         "--max-body-bytes (8388608) exceeds the raft frame limit (4194304 bytes"),
        # A raft port off loopback needs a cluster token (or --insecure-peers).
        (["--members", "1=10.9.9.9:7001,2=10.9.9.8:7001"], {}, "--peer-token-file"),
        (["--members", "1=peer-a:7001,2=peer-b:7001"], {}, "--insecure-peers"),
        (["--members", "1=127.0.0.1:7001,2=127.0.0.1:7002", "--listen-raft",
          "0.0.0.0:7001"], {}, "not loopback"),
        (["--members", "1=10.9.9.9:7001,2=10.9.9.8:7001", "--peer-token-file",
          "/proc/forbidden/token"], {}, "--peer-token-file"),
        (["--members", "1=10.9.9.9:7001,2=10.9.9.8:7001"],
         {"TIERKV_PEER_TOKEN_FILE": "/dev/null"}, "must hold 16"),
        # Peer TLS (issue 15): all three flags, and a certificate that loads.
        (["--members", "1=127.0.0.1:7001,2=127.0.0.1:7002", "--peer-cert-file", "/x.pem"],
         {}, "--peer-trusted-ca-file"),
        (["--members", "1=127.0.0.1:7001,2=127.0.0.1:7002", "--peer-cert-file",
          "/nonexistent/c.pem", "--peer-key-file", "/nonexistent/k.pem",
          "--peer-trusted-ca-file", "/nonexistent/ca.pem"], {}, "/nonexistent/c.pem"),
        (["--peer-cert-file", "/x.pem", "--peer-key-file", "/x.key",
          "--peer-trusted-ca-file", "/ca.pem"], {}, "needs --members"),
        (["--cert-file", "/x.pem"], {}, "--key-file"),
        (["--auth-file", "/nonexistent/users"], {}, "--auth-file"),
    ]
    failed = 0
    for args, env, want in bad:
        code, out = run(binary, args, env)
        if code != 2 or want not in out:
            failed += 1
            print("FAIL %r %r: exit %d, output %r" % (args, env, code, out[-300:]))
    code, out = run(binary, ["--help"])
    if code != 0 or "TIERKV_MEMBERS" not in out or "--listen-http" not in out:
        failed += 1
        print("FAIL --help: exit %d" % code)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    code, out = run(binary, ["--store", "mem", "--listen-http", "127.0.0.1:%d" % port])
    s.close()
    if code != 1 or "cannot listen" not in out:
        failed += 1
        print("FAIL taken port: exit %d, output %r" % (code, out[-300:]))
    # Issue 19: --max-connections must leave descriptors for storage and peers.
    lim = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))  # noqa: E731
    p = subprocess.run([binary, "--store", "mem", "--max-connections", "200"],
                       capture_output=True, timeout=20, preexec_fn=lim)
    out = (p.stdout + p.stderr).decode("utf-8", "replace")
    if p.returncode != 2 or "--max-connections (200) leaves fewer than 256" not in out:
        failed += 1
        print("FAIL --max-connections over the descriptor limit: exit %d, output %r" %
              (p.returncode, out[-300:]))
    print("%d of %d configuration checks failed" % (failed, len(bad) + 3))
    subprocess.run(["rm", "-rf", tmp])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
