#!/usr/bin/env python3
"""--listen-client with --auth-file (etcdapi_auth.c): etcd's token
authentication on the HTTP API's users. One tierkvd, an auth file of three
users (root: admin; app: write:/app/; ro: read:/app/), and etcd-client
-mode auth (auth.go, clientv3 v3.6.16): no token is InvalidArgument `user
name is empty`, an unknown one Unauthenticated; Authenticate with the
user's token as password; each user's rights over Put, Get, Txn, Delete,
Watch, Compact, MemberAdd as the file gives them; Debian's etcdctl with
--user NAME:TOKEN, if installed.

    etcd_auth_test.py TIERKVD ETCD_CLIENT [--no-auth-file]

--no-auth-file is the known-bad control (registered should_fail): the node
runs without the file, so the unauthenticated Put is served and the check
that refuses it must fail.
"""
import hashlib
import os
import secrets
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import tkcluster as tk  # noqa: E402


def run(tierkvd, client, tmp, hold):
    tokens = {u: secrets.token_hex(16) for u in ("root", "app", "ro")}
    rights = {"root": "admin", "app": "write:/app/", "ro": "read:/app/"}
    path = os.path.join(tmp, "auth")
    with open(path, "w") as f:
        for u, t in tokens.items():
            f.write("%s sha256:%s %s\n" % (u, hashlib.sha256(t.encode()).hexdigest(),
                                           rights[u]))
    os.chmod(path, 0o600)
    hport, cport = tk.free_ports(2)
    args = ["--store", "mem", "--listen-http", "127.0.0.1:%d" % hport,
            "--listen-client", "127.0.0.1:%d" % cport]
    if "--no-auth-file" not in sys.argv:
        args += ["--auth-file", path]
    nd = hold[0] = tk.Node(tierkvd, hport, args, tmp)
    nd.start()
    tk.wait_listening(cport, nd)
    deadline = time.time() + 15
    while True:  # /readyz is open to probes without a token
        try:
            if tk.request(hport, "GET", "/readyz")[0] == 200:
                break
        except OSError:
            pass
        tk.check(nd.alive() and time.time() < deadline, "the node did not get ready")
        time.sleep(0.05)
    t0 = time.time()
    r = subprocess.run([client, "-mode", "auth", "-target", "127.0.0.1:%d" % cport,
                        "-root-token", tokens["root"], "-app-token", tokens["app"],
                        "-ro-token", tokens["ro"]], timeout=120)
    tk.check(r.returncode == 0, "etcd-client -mode auth failed (%d)" % r.returncode)
    print("ok   clientv3 with --auth-file's users (%.1fs)" % (time.time() - t0), flush=True)
    etcdctl = shutil.which("etcdctl")
    if etcdctl:  # Debian's 3.4: --user NAME:PASSWORD calls Authenticate
        env = dict(os.environ, ETCDCTL_API="3")
        base = [etcdctl, "--endpoints=127.0.0.1:%d" % cport, "--dial-timeout=5s",
                "--command-timeout=10s", "--user", "app:" + tokens["app"]]
        p = subprocess.run(base + ["put", "/app/ctl", "v"], env=env,
                           capture_output=True, text=True, timeout=60)
        tk.check(p.returncode == 0 and p.stdout.strip() == "OK",
                 "etcdctl --user app put /app/ctl: %d %s %s"
                 % (p.returncode, p.stdout, p.stderr))
        p = subprocess.run(base + ["put", "/other", "v"], env=env,
                           capture_output=True, text=True, timeout=60)
        tk.check(p.returncode != 0 and "permission denied" in p.stderr,
                 "etcdctl --user app put /other: %d %s %s"
                 % (p.returncode, p.stdout, p.stderr))
        print("ok   etcdctl --user app: put /app/ctl, /other permission denied",
              flush=True)


def main():
    tierkvd, client = sys.argv[1], sys.argv[2]
    tk.one_node_test("tierkv-etcd-auth-",
                     lambda tmp, hold: run(tierkvd, client, tmp, hold))


if __name__ == "__main__":
    main()
