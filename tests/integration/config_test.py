#!/usr/bin/env python3
"""tierkvd's configuration checks: each bad setting exits 2 with a message
naming the flag (or its TIERKV_* variable); --help exits 0; a taken HTTP port
exits 1 with a message. Fast (no cluster): suite 'unit'.

Issue 49: boolean flags and variables take exactly true/false/1/0/yes/no
(a false one is off: --insecure-peers=false opens nothing); secret files
(--peer-token-file, --peer-key-file, --key-file, --auth-file) that group or
others may read or write are refused, naming the file, unless
--allow-loose-permissions; a raft port on loopback without a token starts
with one warning. The cases that must start run tierkvd until it logs
"tierkvd listening", then stop it with SIGTERM.

Issue 52: docs/tierkvd.md's OPTIONS section is exactly what
`tierkvd --help-markdown` prints from the option table
(cmd/tierkvd/options.c), the table --help comes from too; with --write-docs
this script rewrites that section from the table instead of checking it.

usage: config_test.py path/to/tierkvd [--write-docs]
"""
import difflib
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def run(binary, args, env=None, timeout=10):
    e = dict(os.environ)
    e.update(env or {})
    try:
        p = subprocess.run([binary] + args, capture_output=True, timeout=timeout, env=e)
    except subprocess.TimeoutExpired as t:  # it started instead of refusing
        return -1, ((t.stdout or b"") + (t.stderr or b"")).decode("utf-8", "replace")
    return p.returncode, (p.stdout + p.stderr).decode("utf-8", "replace")


def start(binary, args, env=None, timeout=15):
    """Runs tierkvd until it logs "tierkvd listening" (then SIGTERM) or exits.
    Returns (started, exit code, output)."""
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.Popen([binary] + args, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=e)
    lines, listening = [], threading.Event()

    def read():
        for ln in p.stderr:
            lines.append(ln.decode("utf-8", "replace"))
            if "tierkvd listening" in lines[-1]:
                listening.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    deadline = time.time() + timeout
    while time.time() < deadline and p.poll() is None and not listening.is_set():
        listening.wait(0.05)
    started = listening.is_set()
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        code = p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        code = p.wait()
    t.join(timeout=5)
    return started, code, "".join(lines)


def secret(tmp, name, mode, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def secret_files(tmp):
    """The secret files the permission cases use: a token, a peer key and
    certificate (self-signed, naming node-1), an auth file; each at 0600 and
    loose."""
    f = {}
    tok = "0123456789abcdef0123456789abcdef\n"
    f["tok600"] = secret(tmp, "tok600", 0o600, tok)
    f["tok644"] = secret(tmp, "tok644", 0o644, tok)
    f["toklink"] = os.path.join(tmp, "toklink")
    os.symlink(f["tok644"], f["toklink"])
    f["tokempty"] = secret(tmp, "tokempty", 0o600, "")
    users = "boss sha256:%s admin\n" % ("ab" * 32)
    f["auth600"] = secret(tmp, "auth600", 0o600, users)
    f["auth620"] = secret(tmp, "auth620", 0o620, users)
    f["auth604"] = secret(tmp, "auth604", 0o604, users)
    f["cert"] = os.path.join(tmp, "node1.pem")
    f["key600"] = os.path.join(tmp, "node1.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", f["key600"], "-out",
                    f["cert"], "-days", "2", "-subj", "/CN=node-1", "-addext",
                    "subjectAltName=DNS:node-1"], check=True, capture_output=True)
    os.chmod(f["key600"], 0o600)
    with open(f["key600"]) as src:
        f["key666"] = secret(tmp, "node1-666.key", 0o666, src.read())
    with open(f["key600"]) as src:
        f["key640"] = secret(tmp, "node1-640.key", 0o640, src.read())
    return f


def flag_and_secret_checks(binary, tmp):
    """Issue 49 item 4 (and item 6's loopback warning). Returns failures."""
    f = secret_files(tmp)
    off_lo = ["--members", "1=10.9.9.9:7001,2=10.9.9.8:7001"]
    mem = ["--store", "mem", "--listen-http", "127.0.0.1:0"]
    # A single voter whose raft port is off loopback (every interface, a
    # kernel-chosen port), or on loopback.
    any_if = mem + ["--members", "1=127.0.0.1:7001", "--listen-raft", "0.0.0.0:0"]
    lo = mem + ["--members", "1=127.0.0.1:7001", "--listen-raft", "127.0.0.1:0"]
    peer_tls = ["--peer-cert-file", f["cert"], "--peer-trusted-ca-file", f["cert"]]
    mode_msg = "has mode"
    bad = [
        # A false value is off: the raft port stays closed, as without the flag.
        (off_lo + ["--insecure-peers=false"], {}, "--peer-token-file"),
        (off_lo + ["--insecure-peers=No"], {}, "--peer-token-file"),
        (off_lo + ["--insecure-peers=0"], {}, "--peer-token-file"),
        (off_lo, {"TIERKV_INSECURE_PEERS": "0"}, "--peer-token-file"),
        (off_lo, {"TIERKV_INSECURE_PEERS": "false"}, "--peer-token-file"),
        # Anything but true/false/1/0/yes/no is refused, named, on every boolean.
        (off_lo + ["--insecure-peers=maybe"], {},
         '--insecure-peers="maybe" is not a boolean: use true, false, 1, 0, yes or no'),
        (mem + ["--insecure-peers="], {}, '--insecure-peers="" is not a boolean'),
        (mem, {"TIERKV_INSECURE_PEERS": "2"},
         'TIERKV_INSECURE_PEERS="2" (--insecure-peers) is not a boolean: use true, '
         'false, 1, 0, yes or no'),
        (mem + ["--kv-no-sync=on"], {}, '--kv-no-sync="on" is not a boolean'),
        (mem + ["--join=maybe"], {}, '--join="maybe" is not a boolean'),
        (mem + ["--force-new-cluster=2"], {}, '--force-new-cluster="2" is not a boolean'),
        (mem, {"TIERKV_ALLOW_LOOSE_PERMISSIONS": "sure"},
         'TIERKV_ALLOW_LOOSE_PERMISSIONS="sure"'),
        # --join=false is not a join (which would need --members).
        # Secret files that group or others may read or write.
        (lo + ["--peer-token-file", f["tok644"]], {}, '"%s" has mode 0644' % f["tok644"]),
        (lo + ["--peer-token-file", f["tok644"]], {}, 'chmod 600 %s' % f["tok644"]),
        (lo + ["--peer-token-file", f["toklink"]], {},
         '"%s" (a symlink to "%s") has mode 0644' % (f["toklink"], f["tok644"])),
        (lo, {"TIERKV_PEER_TOKEN_FILE": "/dev/null"}, '"/dev/null" has mode 0666'),
        (lo + ["--peer-token-file", f["tokempty"]], {}, "must hold 16"),
        # The key is fine (0600): the missing certificate is named.
        (lo + ["--peer-cert-file", "/nonexistent/c.pem", "--peer-key-file", f["key600"],
               "--peer-trusted-ca-file", f["cert"]], {}, "/nonexistent/c.pem"),
        (lo + peer_tls + ["--peer-key-file", f["key666"]], {},
         '--peer-key-file: "%s" has mode 0666' % f["key666"]),
        (lo + peer_tls + ["--peer-key-file", f["key640"]], {},
         '--peer-key-file: "%s" has mode 0640' % f["key640"]),
        (mem + ["--cert-file", f["cert"], "--key-file", f["key640"]], {},
         '--key-file: "%s" has mode 0640' % f["key640"]),
        (mem + ["--auth-file", f["auth620"]], {},
         '--auth-file: "%s" has mode 0620' % f["auth620"]),
        (mem + ["--auth-file", f["auth604"]], {},
         '--auth-file: "%s" has mode 0604' % f["auth604"]),
        (mem + ["--auth-file", f["auth620"], "--allow-loose-permissions=false"], {},
         mode_msg),
        (mem + ["--auth-file", f["auth620"]], {"TIERKV_ALLOW_LOOSE_PERMISSIONS": "0"},
         mode_msg),
    ]
    failed = 0
    for args, env, want in bad:
        code, out = run(binary, args, env)
        if code != 2 or want not in out:
            failed += 1
            print("FAIL %r %r: exit %d, output %r" % (args, env, code, out[-400:]))
    open_warn = "--insecure-peers: the raft port takes any peer"
    lo_warn = "the raft port is open to every local process"
    loose_warn = "accepted because of --allow-loose-permissions"
    # (args, env, text that must be in the log, text that must not be)
    good = [
        (any_if + ["--insecure-peers=true"], {}, open_warn, None),
        (any_if + ["--insecure-peers=YES"], {}, open_warn, None),
        (any_if + ["--insecure-peers=1"], {}, open_warn, None),
        (any_if + ["--insecure-peers"], {}, open_warn, None),
        (any_if, {"TIERKV_INSECURE_PEERS": "yes"}, open_warn, None),
        (any_if + ["--peer-token-file", f["tok600"]], {}, None, open_warn),
        (mem + ["--join=false"], {}, None, None),
        (lo + ["--peer-token-file", f["tok644"], "--allow-loose-permissions"], {},
         '--peer-token-file: \\"%s\\" has mode 0644' % f["tok644"], None),
        (lo + ["--peer-token-file", f["toklink"]],
         {"TIERKV_ALLOW_LOOSE_PERMISSIONS": "true"}, loose_warn, None),
        (lo + peer_tls + ["--peer-key-file", f["key666"], "--allow-loose-permissions"],
         {}, loose_warn, None),
        (mem + ["--cert-file", f["cert"], "--key-file", f["key640"],
                "--allow-loose-permissions=yes"], {}, loose_warn, None),
        (mem + ["--auth-file", f["auth620"], "--allow-loose-permissions"], {},
         loose_warn, None),
        (lo + ["--peer-token-file", f["tok600"]], {}, None, mode_msg),
        (lo + peer_tls + ["--peer-key-file", f["key600"]], {}, None, mode_msg),
        (mem + ["--cert-file", f["cert"], "--key-file", f["key600"]], {}, None, mode_msg),
        (mem + ["--auth-file", f["auth600"]], {}, None, mode_msg),
        # Item 6: loopback and no token starts, warned once; a token or peer
        # TLS, or no raft port at all, is not warned.
        (lo, {}, lo_warn, None),
        (lo + ["--peer-token-file", f["tok600"]], {}, None, lo_warn),
        (lo + peer_tls + ["--peer-key-file", f["key600"]], {}, None, lo_warn),
        (mem, {}, None, lo_warn),
    ]
    for args, env, want, unwanted in good:
        started, code, out = start(binary, args, env)
        why = None
        if not started or code != 0:
            why = "did not start and stop cleanly (exit %d)" % code
        elif want is not None and out.count(want) != 1:
            why = "%r logged %d times, want once" % (want, out.count(want))
        elif unwanted is not None and unwanted in out:
            why = "%r logged" % unwanted
        if why:
            failed += 1
            print("FAIL %r %r: %s; output %r" % (args, env, why, out[-600:]))
    return failed, len(bad) + len(good)


DOC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "docs", "tierkvd.md"))


def docs_options(binary, write):
    """docs/tierkvd.md between "## OPTIONS" and the next "## " is what the
    table prints. Returns the number of failures (0 or 1)."""
    p = subprocess.run([binary, "--help-markdown"], capture_output=True, timeout=10)
    table = p.stdout.decode()
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    start = doc.index("## OPTIONS\n\n") + len("## OPTIONS\n\n")
    end = doc.index("\n## ", start) + 1
    if p.returncode != 0 or table.count("| `--") < 50:
        print("FAIL --help-markdown: exit %d, %d options" % (p.returncode,
                                                              table.count("| `--")))
        return 1
    if write:
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(doc[:start] + table + "\n" + doc[end:])
        print("wrote the OPTIONS section of %s" % DOC)
        return 0
    if doc[start:end] == table + "\n":
        return 0
    diff = difflib.unified_diff(doc[start:end].split("\n"), (table + "\n").split("\n"),
                                "docs/tierkvd.md", "tierkvd --help-markdown", lineterm="")
    print("FAIL docs/tierkvd.md's OPTIONS differ from the option table "
          "(cmd/tierkvd/options.c); to take the table's: "
          "tests/integration/config_test.py build/cmd/tierkvd/tierkvd --write-docs")
    print("\n".join(list(diff)[:40]))
    return 1


def main():
    binary = sys.argv[1]
    if sys.argv[2:] == ["--write-docs"]:
        sys.exit(docs_options(binary, True))
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
        # Issue 48: the HTTPS handshake caps.
        (["--max-tls-handshakes", "4", "--max-tls-handshakes-per-addr", "8"], {},
         "--max-tls-handshakes-per-addr (8) must be at most --max-tls-handshakes (4)"),
        (["--max-tls-handshakes", "0"], {}, "--max-tls-handshakes"),
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
        # Peer TLS (issue 15): all three flags, and a certificate that loads.
        (["--members", "1=127.0.0.1:7001,2=127.0.0.1:7002", "--peer-cert-file", "/x.pem"],
         {}, "--peer-trusted-ca-file"),
        (["--members", "1=127.0.0.1:7001,2=127.0.0.1:7002", "--peer-cert-file",
          "/nonexistent/c.pem", "--peer-key-file", "/nonexistent/k.pem",
          "--peer-trusted-ca-file", "/nonexistent/ca.pem"], {},
         '--peer-key-file: cannot open "/nonexistent/k.pem"'),
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
    more_failed, more = flag_and_secret_checks(binary, tmp)
    failed += more_failed
    failed += docs_options(binary, False)
    print("%d of %d configuration checks failed" % (failed, len(bad) + 4 + more))
    subprocess.run(["rm", "-rf", tmp])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
