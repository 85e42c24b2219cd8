#!/usr/bin/env python3
"""Bearer tokens on the gateway (--auth-file, issue 15), one node on
loopback: 401 without a token or with an unknown one (JSON error and
WWW-Authenticate), probes stay open, a read-only token writing gets 403,
rights per key prefix for keys, scans, ranges, batches and transactions,
deleting every key and the digest need admin, the Idempotency-Key is a
namespace per user (the same key from two users is two writes, never a
replay of the other's answer), the CLI's token from --token-file or
TIERKV_TOKEN (--token on argv still works, with a warning; a token file that
group or others may read is refused unless --allow-loose-permissions), and a
bad auth file refused at start with its line.

usage: auth_test.py path/to/tierkvd path/to/tierkv
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import Fail, Node, check, free_ports, jreq, request  # noqa: E402

TOKENS = {
    "boss": "tok-boss-0123456789abcdef",
    "rw": "tok-rw-0123456789abcdef",
    "rw2": "tok-rw2-0123456789abcdef",
    "ro": "tok-ro-0123456789abcdef",
}


def h(tok):
    return "sha256:" + hashlib.sha256(tok.encode()).hexdigest()


def auth(user):
    return {"Authorization": "Bearer " + TOKENS[user]}


def err_code(js):
    return js.get("error", {}).get("code") if isinstance(js, dict) else None


def start(tierkvd, tmp, auth_file):
    port = free_ports(1)[0]
    nd = Node(tierkvd, port, ["--store", "mem", "--listen-http", "127.0.0.1:%d" % port,
                              "--auth-file", auth_file], tmp)
    nd.http_port = port
    nd.start()
    deadline = time.time() + 15
    while time.time() < deadline:
        check(nd.alive(), "tierkvd exited: %s" % nd.log()[-2000:])
        try:
            if request(port, "GET", "/readyz", timeout=1)[0] == 200:
                return nd
        except OSError:
            pass
        time.sleep(0.05)
    raise Fail("tierkvd not ready")


def expect(port, user, method, path, want, body=None, headers=None):
    hd = dict(auth(user) if user else {})
    hd.update(headers or {})
    st, rh, data = request(port, method, path, body, hd)
    check(st == want, "%s %s as %s: want %d, got %d %r" % (method, path, user, want, st,
                                                           data[:200]))
    js = json.loads(data) if data and data[:1] in (b"{", b"[") else None
    if want in (401, 403):
        check(err_code(js) == ("unauthorized" if want == 401 else "forbidden"),
              "%s %s: error body %r" % (method, path, data[:200]))
    if want == 401:
        check(rh.get("www-authenticate", "").startswith("Bearer"),
              "401 without WWW-Authenticate: %r" % rh)
    return js


def token_file(tmp, name, tok, mode=0o600):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(tok + "\n")
    os.chmod(path, mode)
    return path


def run_checks(port, tierkv, tmp):
    # Authentication.
    expect(port, None, "GET", "/v1/kv/app/x", 401)
    expect(port, None, "PUT", "/v1/kv/app/x", 401, body=b"v")
    st, _, _ = request(port, "GET", "/v1/kv/app/x", None, {"Authorization": "Bearer nope"})
    check(st == 401, "an unknown token: %d" % st)
    st, _, _ = request(port, "GET", "/v1/kv/app/x", None,
                       {"Authorization": "Basic " + TOKENS["rw"]})
    check(st == 401, "a token not sent as Bearer: %d" % st)
    st, _, _ = request(port, "GET", "/v1/kv/app/x", None,
                       {"Authorization": "Bearer " + "x" * 2000})
    check(st == 401, "an oversized Authorization header: %d" % st)
    check(request(port, "GET", "/healthz")[0] == 200, "/healthz needs no token")
    check(request(port, "GET", "/readyz")[0] == 200, "/readyz needs no token")
    # Keys by prefix: read-only writing is 403, outside the prefix is 403.
    expect(port, "rw", "PUT", "/v1/kv/app/x", 200, body=b"v1")
    expect(port, "ro", "GET", "/v1/kv/app/x", 200)
    expect(port, "ro", "PUT", "/v1/kv/app/x", 403, body=b"v2")
    expect(port, "ro", "DELETE", "/v1/kv/app/x", 403)
    expect(port, "ro", "POST", "/v1/kv/app/n/incr", 403)
    expect(port, "rw", "PUT", "/v1/kv/other/x", 403, body=b"v")
    expect(port, "ro", "GET", "/v1/kv/other/x", 403)
    st, _, js = jreq(port, "GET", "/v1/kv/app/x", headers=auth("ro"))
    check(st == 200 and js["value"] == "v1", "the 403 PUT changed nothing: %r" % js)
    # Scans and ranges.
    expect(port, "ro", "GET", "/v1/kv/?prefix=app/", 200)
    expect(port, "ro", "GET", "/v1/kv/?prefix=", 403)
    expect(port, "ro", "GET", "/v1/kv/?prefix=ap", 403)
    expect(port, "ro", "GET", "/v1/kv/?start=app/a&end=app0", 200)
    expect(port, "ro", "GET", "/v1/kv/?start=app/a&end=app1", 403)
    expect(port, "ro", "GET", "/v1/kv/?start=app/a", 403)
    expect(port, "rw", "DELETE", "/v1/kv/?prefix=app/zz", 200)
    expect(port, "rw", "DELETE", "/v1/kv/?prefix=", 403)
    expect(port, "rw", "DELETE", "/v1/kv/?start=a&end=b", 403)
    # Batches and transactions: every key.
    ok = {"ops": [{"op": "put", "key": "app/b1", "value": "1"}]}
    bad = {"ops": [{"op": "put", "key": "app/b1", "value": "1"},
                   {"op": "put", "key": "zzz", "value": "1"}]}
    check(jreq(port, "POST", "/v1/batch", ok, auth("rw"))[0] == 200, "batch in the prefix")
    st, _, js = jreq(port, "POST", "/v1/batch", bad, auth("rw"))
    check(st == 403 and err_code(js) == "forbidden", "batch with a key outside: %d" % st)
    txn = {"compare": [{"key": "secret/k", "target": "absent"}],
           "then": [{"op": "put", "key": "app/t", "value": "1"}], "else": []}
    st, _, js = jreq(port, "POST", "/v1/txn", txn, auth("rw"))
    check(st == 403, "txn comparing a key it may not read: %d %r" % (st, js))
    txn["compare"][0]["key"] = "app/k"
    txn["else"] = [{"op": "put", "key": "elsewhere", "value": "1"}]
    st, _, js = jreq(port, "POST", "/v1/txn", txn, auth("rw"))
    check(st == 403, "txn with an else op outside: %d %r" % (st, js))
    txn["else"] = []
    st, _, js = jreq(port, "POST", "/v1/txn", txn, auth("rw"))
    check(st == 200 and js.get("succeeded") is True, "txn inside the prefix: %d %r" % (st, js))
    # Admin.
    expect(port, "rw", "GET", "/v1/debug/digest", 403)
    expect(port, "boss", "GET", "/v1/debug/digest", 200)
    expect(port, "rw", "GET", "/v1/cluster", 200)
    expect(port, "boss", "DELETE", "/v1/kv/?prefix=", 200)
    # The Idempotency-Key is per user.
    idem = {"Idempotency-Key": "same-key-for-both"}
    js = expect(port, "rw", "PUT", "/v1/kv/app/idem", 200, body=b"from-rw", headers=idem)
    check(not js.get("replayed"), "first write replayed: %r" % js)
    js = expect(port, "rw", "PUT", "/v1/kv/app/idem", 200, body=b"from-rw", headers=idem)
    check(js.get("replayed") is True, "the same user's retry was not replayed: %r" % js)
    js = expect(port, "rw2", "PUT", "/v1/kv/app/idem", 200, body=b"from-rw2", headers=idem)
    check(not js.get("replayed"), "another user's key replayed rw's answer: %r" % js)
    st, _, js = jreq(port, "GET", "/v1/kv/app/idem", headers=auth("ro"))
    check(js["value"] == "from-rw2", "rw2's write was not applied: %r" % js)
    st, _, body = request(port, "GET", "/metrics", None, auth("ro"))
    denied = [ln for ln in body.decode().splitlines()
              if ln.startswith("tierkv_http_auth_denied_total ")]
    check(st == 200 and denied and float(denied[0].split()[1]) >= 10,
          "tierkv_http_auth_denied_total: %r" % denied)
    # The CLI: the token from a file only its owner may read, or TIERKV_TOKEN.
    base = [tierkv, "-e", "127.0.0.1:%d" % port, "--retries", "0"]
    rw_file = token_file(tmp, "rw.token", TOKENS["rw"])
    p = subprocess.run(base + ["--token-file", rw_file, "put", "app/cli", "v0"],
                       capture_output=True, timeout=30)
    check(p.returncode == 0 and not p.stderr,
          "tierkv --token-file put: %d %r" % (p.returncode, p.stderr))
    st, _, js = jreq(port, "GET", "/v1/kv/app/cli", headers=auth("ro"))
    check(st == 200 and js["value"] == "v0", "--token-file's write: %d %r" % (st, js))
    # A token file group or others may read is refused before any request.
    loose = token_file(tmp, "loose.token", TOKENS["rw"], 0o644)
    p = subprocess.run(base + ["--token-file", loose, "put", "app/cli", "loose"],
                       capture_output=True, timeout=30)
    err = p.stderr.decode(errors="replace")
    check(p.returncode == 2 and ('"%s" has mode 0644' % loose) in err and
          ("chmod 600 %s" % loose) in err, "a 0644 --token-file: %d %r" % (p.returncode, err))
    st, _, js = jreq(port, "GET", "/v1/kv/app/cli", headers=auth("ro"))
    check(js["value"] == "v0", "the refused CLI wrote: %r" % js)
    for extra, env in ((["--allow-loose-permissions"], None),
                       ([], dict(os.environ, TIERKV_ALLOW_LOOSE_PERMISSIONS="yes"))):
        p = subprocess.run(base + extra + ["--token-file", loose, "put", "app/cli", "v"],
                           capture_output=True, timeout=30, env=env)
        err = p.stderr.decode(errors="replace")
        check(p.returncode == 0 and err.count("has mode 0644") == 1 and
              "--allow-loose-permissions" in err,
              "a 0644 --token-file, allowed by %r: %d %r" % (extra or env, p.returncode, err))
    p = subprocess.run(base + ["--allow-loose-permissions=maybe", "get", "app/cli"],
                       capture_output=True, timeout=30)
    check(p.returncode == 2, "--allow-loose-permissions=maybe: %d" % p.returncode)
    # --token on argv still works, with a warning that ps shows it.
    p = subprocess.run(base + ["--token", TOKENS["rw"], "put", "app/cli", "v"],
                       capture_output=True, timeout=30)
    check(p.returncode == 0 and b"ps shows it" in p.stderr,
          "tierkv --token put: %d %r" % (p.returncode, p.stderr))
    env = dict(os.environ, TIERKV_TOKEN=TOKENS["ro"])
    p = subprocess.run(base + ["get", "app/cli"], capture_output=True, timeout=30, env=env)
    check(p.returncode == 0 and b"app/cli" in p.stdout, "TIERKV_TOKEN get: %r" % (p,))
    p = subprocess.run(base + ["put", "app/cli", "w"], capture_output=True, timeout=30,
                       env=env)
    check(p.returncode == 7 and b"forbidden" in p.stdout + p.stderr,
          "read-only token put via the CLI: %d %r" % (p.returncode, p.stdout + p.stderr))
    p = subprocess.run(base + ["get", "app/cli"], capture_output=True, timeout=30)
    check(p.returncode == 7, "no token via the CLI: %d %r" % (p.returncode, p.stderr))
    # tierkv bench sends the token on every request.
    for tok, want_errors in ((rw_file, False), (None, True)):
        p = subprocess.run(base + (["--token-file", tok] if tok else []) +
                           ["bench", "--duration", "1s", "--warmup", "0", "--connections",
                            "2", "--keys", "50", "--key-prefix", "app/bench/"],
                           capture_output=True, timeout=60)
        rows = [json.loads(ln) for ln in p.stdout.decode().splitlines() if ln.startswith("{")]
        if want_errors:
            check(p.returncode != 0 or not rows or rows[-1]["errors"] > 0,
                  "bench without a token had no errors: %r" % (p.stdout,))
        else:
            check(p.returncode == 0 and rows and rows[-1]["ops"] > 0 and
                  rows[-1]["errors"] == 0,
                  "bench --token-file: %r %r" % (p.stdout, p.stderr))


def bad_files(tierkvd, tmp):
    cases = [
        ("rw sha256:%s write:app/\n" % ("0" * 63), "64 hex"),
        ("rw %s\n" % h("x"), "no right"),
        ("rw %s read:a\nrw %s admin\n" % (h("x"), h("y")), "appears twice"),
        ("rw %s grant:all\n" % h("x"), "bad right"),
        ("# nothing\n", "no user"),
    ]
    for text, want in cases:
        path = os.path.join(tmp, "bad.auth")
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o600)  # else refused for its mode, before its lines
        p = subprocess.run([tierkvd, "--store", "mem", "--listen-http", "127.0.0.1:0",
                            "--auth-file", path], capture_output=True, timeout=20)
        out = (p.stdout + p.stderr).decode(errors="replace")
        check(p.returncode == 2 and want in out and "bad.auth:" in out,
              "%r: rc %d %s" % (text, p.returncode, out))


def main():
    tierkvd, tierkv = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="tierkv-auth-")
    path = os.path.join(tmp, "users.auth")
    with open(path, "w") as f:
        f.write("# test users\n")
        f.write("boss  %s  admin\n" % h(TOKENS["boss"]))
        f.write("rw    %s  write:app/\n" % h(TOKENS["rw"]))
        f.write("rw2   %s  write:app/   # a second writer\n" % h(TOKENS["rw2"]))
        f.write("ro    %s  read:app/ read:%s\n" % (h(TOKENS["ro"]),
                                                  urllib.parse.quote("q\xff", safe="")))
    os.chmod(path, 0o600)  # a secret file: tierkvd refuses it otherwise
    failed = 0
    for name, fn in (("checks", lambda: run_checks(start(tierkvd, tmp, path).http_port,
                                                   tierkv, tmp)),
                     ("bad auth files", lambda: bad_files(tierkvd, tmp))):
        try:
            fn()
            print("ok   %s" % name)
        except Exception as e:  # noqa: BLE001
            failed += 1
            print("FAIL %s: %s" % (name, e))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
