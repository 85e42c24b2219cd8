#!/usr/bin/env python3
"""Leases with three real tierkvd processes on loopback (fs store).

- the HTTP API: grant, attach keys with PUT ?lease=, GET (TTL, remaining,
  keys), a put without lease detaches, keepalive, revoke deletes every
  attached key at one revision, 404 for a keepalive on a revoked lease;
- expiry across leader kills: a lease of TTL 3 s with a key attached, the
  leader killed (and restarted) 3 times while it runs; the key must never be
  gone before 3 s after the grant was sent, and must be gone by 3 s + 2 s
  after the grant was answered (the measured delay past 3 s is printed);
- restarts: every node stopped and started again; the lease is back with its
  keys and a remaining TTL that did not start over.

- tierkv lock: 4 processes, each 3 times, around a critical section that
  appends start and end lines to a file: no two sections overlap and the
  fencing revisions (TIERKV_LOCK_REVISION) increase;
- tierkv elect: a second candidate takes over when the first resigns.
- signals: a waiting `lock` given SIGINT withdraws at once (its key gone,
  exit 130) and a holding one given SIGTERM passes it to COMMAND and releases
  (exit 143), both long before their 30 s TTL; so does a waiting `elect`.

usage: lease_test.py path/to/tierkvd [path/to/tierkv]
"""
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import Cluster, Fail, check, finish, jreq, request, run  # noqa: E402

C = None
CLI = None


def any_req(method, path, obj=None, ok=(200,), timeout=10):
    """Sends to a live node (any: the gateway forwards writes), retrying while
    there is no leader. Returns (status, json)."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        for nd in C.nodes:
            if not nd.alive():
                continue
            try:
                st, _, js = jreq(nd.http_port, method, path, obj, timeout=2)
            except OSError as e:
                last = e
                continue
            if st in ok or st in (404, 400, 409):
                return st, js
            last = (st, js)
        time.sleep(0.05)
    raise Fail("%s %s: no answer within %ss (last %r)" % (method, path, timeout, last))


def grant(ttl_ms):
    st, js = any_req("POST", "/v1/leases", {"ttl_ms": ttl_ms})
    check(st == 200, "grant: %s %r" % (st, js))
    check(js["ttl_ms"] == ttl_ms and js["id"] > 0, "grant answer %r" % js)
    return js["id"]


def test_lease_api():
    lid = grant(60000)
    for k in ("api/a", "api/b", "api/c"):
        st, js = any_req("PUT", "/v1/kv/%s?lease=%d" % (k, lid), {"value": "v"})
        check(st == 200, "put %s: %s %r" % (k, st, js))
    st, js = any_req("PUT", "/v1/kv/api/x?lease=%d" % (lid + 1000000), {"value": "v"})
    check(st == 404, "put with an unknown lease: %s %r" % (st, js))
    st, js = any_req("PUT", "/v1/kv/api/c", {"value": "free"})  # detaches
    check(st == 200, "put without lease: %s" % st)
    st, js = any_req("GET", "/v1/leases/%d" % lid)
    check(st == 200, "get lease: %s %r" % (st, js))
    check(sorted(js["keys"]) == ["api/a", "api/b"], "lease keys %r" % js)
    check(0 < js["remaining_ms"] <= 60000 and js["ttl_ms"] == 60000, "lease %r" % js)
    st, js = any_req("POST", "/v1/leases/%d/keepalive" % lid)
    check(st == 200 and js["ttl_ms"] == 60000, "keepalive: %s %r" % (st, js))
    st, js = any_req("DELETE", "/v1/leases/%d" % lid)
    check(st == 200 and js["deleted"] == 2, "revoke: %s %r" % (st, js))
    for k, want in (("api/a", 404), ("api/b", 404), ("api/c", 200)):
        st, _ = any_req("GET", "/v1/kv/%s" % k)
        check(st == want, "after revoke %s: %s, want %s" % (k, st, want))
    st, js = any_req("POST", "/v1/leases/%d/keepalive" % lid)
    check(st == 404, "keepalive on a revoked lease: %s %r" % (st, js))
    st, js = any_req("GET", "/v1/leases/%d" % lid)
    check(st == 404, "get a revoked lease: %s" % st)
    st, js = any_req("POST", "/v1/leases", {"ttl_ms": 0})
    check(st == 400, "ttl 0: %s" % st)
    st, js = any_req("PUT", "/v1/kv/%%01tierkv%%2Flease%%2F%016x" % lid, {"value": "x"})
    check(st == 400, "a write under the reserved prefix: %s %r" % (st, js))


class Poller(threading.Thread):
    """Reads the key from the live nodes until it is gone: (start, end,
    present) per answered read."""

    def __init__(self, key):
        super().__init__(daemon=True)
        self.key, self.obs, self.stop = key, [], False

    def run(self):
        while not self.stop:
            for nd in list(C.nodes):
                if not nd.alive():
                    continue
                t0 = time.time()
                try:
                    st, _, _ = request(nd.http_port, "GET", "/v1/kv/" + self.key, timeout=1)
                except OSError:
                    continue
                t1 = time.time()
                if st in (200, 404):
                    self.obs.append((t0, t1, st == 200))
                    if st == 404:
                        self.stop = True
                        return
                break
            time.sleep(0.01)


def test_expiry_across_three_leader_kills():
    ttl = 3.0
    t_send = time.time()
    lid = grant(int(ttl * 1000))
    t_ack = time.time()
    st, js = any_req("PUT", "/v1/kv/kill/k?lease=%d" % lid, {"value": "v"})
    check(st == 200, "attach: %s %r" % (st, js))
    p = Poller("kill/k")
    p.start()
    kills = []
    for i in range(3):
        lead = C.wait_leader(timeout=10)
        while time.time() < t_send + 0.4 + 0.8 * i:  # spread over the TTL
            time.sleep(0.01)
        C.node(lead).kill()
        kills.append(time.time() - t_send)
        C.node(lead).start()
    p.join(timeout=15)
    p.stop = True
    gone = [o for o in p.obs if not o[2]]
    check(gone, "the key never went away (%d reads)" % len(p.obs))
    first_gone_end = gone[0][1]
    last_present = max([o[0] for o in p.obs if o[2]] or [t_send])
    early = first_gone_end - t_send
    check(early >= ttl, "the key was gone %.3fs after the grant was sent (< %.1fs)" %
          (early, ttl))
    delay = first_gone_end - t_ack - ttl
    print("     leader kills at %s s; key last seen %.3f s, gone by %.3f s after the "
          "grant; expiry delay past the TTL: at most %.3f s (bound 2 s)" %
          (", ".join("%.2f" % k for k in kills), last_present - t_send, early, delay),
          flush=True)
    check(first_gone_end <= t_ack + ttl + 2.0,
          "gone only %.3fs after the grant's answer (> %.1fs)" % (first_gone_end - t_ack,
                                                                  ttl + 2.0))
    st, js = any_req("POST", "/v1/leases/%d/keepalive" % lid)
    check(st == 404, "keepalive on an expired lease: %s %r" % (st, js))


def test_restart_keeps_leases():
    lid = grant(60000)
    t_grant = time.time()
    st, _ = any_req("PUT", "/v1/kv/rs/k?lease=%d" % lid, {"value": "v"})
    check(st == 200, "attach: %s" % st)
    time.sleep(2.0)
    codes = C.stop()
    check(all(c == 0 for c in codes.values()), "exit codes %r" % codes)
    C.start()
    C.wait_leader(timeout=15)
    st, js = any_req("GET", "/v1/leases/%d" % lid, ok=(200,))
    check(st == 200, "lease after restart: %s %r" % (st, js))
    check(js["keys"] == ["rs/k"], "keys after restart %r" % js)
    ran = time.time() - t_grant
    print("     remaining after restart: %d ms (TTL 60000, %.1f s since the grant)" %
          (js["remaining_ms"], ran), flush=True)
    check(js["remaining_ms"] <= 59000, "the TTL started over: %r" % js)
    st, js = any_req("DELETE", "/v1/leases/%d" % lid)
    check(st == 200 and js["deleted"] == 1, "revoke after restart: %s %r" % (st, js))


def endpoints():
    return ",".join("127.0.0.1:%d" % nd.http_port for nd in C.nodes)


SECTION = ('echo "start $$ $TIERKV_LOCK_REVISION" >> "$F"; sleep 0.2; '
           'echo "end $$ $TIERKV_LOCK_REVISION" >> "$F"')


def check_sections(lines):
    """The lock file: start/end pairs of one process, never interleaved, with
    increasing revisions. Returns the revisions."""
    revs = []
    check(len(lines) % 2 == 0, "odd number of lines: %r" % lines)
    for i in range(0, len(lines), 2):
        a, b = lines[i].split(), lines[i + 1].split()
        check(a[0] == "start" and b[0] == "end" and a[1:] == b[1:],
              "overlap or broken section at line %d: %r %r" % (i, lines[i], lines[i + 1]))
        revs.append(int(a[2]))
    check(all(x < y for x, y in zip(revs, revs[1:])), "fencing revisions %r" % revs)
    return revs


def test_check_sections_rejects_bad_files():
    for bad in (["start 1 5", "start 2 6", "end 1 5", "end 2 6"],
                ["start 1 6", "end 1 6", "start 2 5", "end 2 5"]):
        try:
            check_sections(bad)
        except Fail:
            continue
        raise Fail("the checker accepted %r" % bad)


def test_lock_four_processes():
    if CLI is None:
        print("     skipped: no tierkv binary given", flush=True)
        return
    d = tempfile.mkdtemp(prefix="tierkv-lock-")
    f = os.path.join(d, "log")
    env = dict(os.environ, F=f)
    script = "for i in 1 2 3; do %s -e %s lock --ttl 3s demo -- sh -c '%s' || exit 1; done" % (
        CLI, endpoints(), SECTION)
    t0 = time.time()
    procs = [subprocess.Popen(["sh", "-c", script], env=env) for _ in range(4)]
    codes = [p.wait(timeout=120) for p in procs]
    took = time.time() - t0
    check(codes == [0, 0, 0, 0], "lock exit codes %r" % codes)
    with open(f) as fh:
        lines = [ln.strip() for ln in fh if ln.strip()]
    check(len(lines) == 24, "%d lines, want 24: %r" % (len(lines), lines))
    revs = check_sections(lines)
    print("     12 sections by 4 processes in %.1f s, no overlap; fencing revisions %s" %
          (took, revs), flush=True)


def test_elect_takeover():
    if CLI is None:
        print("     skipped: no tierkv binary given", flush=True)
        return
    a = subprocess.Popen([CLI, "-e", endpoints(), "elect", "--ttl", "3s", "boss", "alpha"],
                         stdout=subprocess.PIPE, text=True)
    line = a.stdout.readline().strip()
    check(line.startswith("elected alpha"), "first candidate: %r" % line)
    b = subprocess.Popen([CLI, "-e", endpoints(), "elect", "--ttl", "3s", "boss", "beta"],
                         stdout=subprocess.PIPE, text=True)
    line = b.stdout.readline().strip()
    check(line == "leader alpha", "second candidate sees: %r" % line)
    a.terminate()
    check(a.wait(timeout=10) == 0, "resign exit code")
    line = b.stdout.readline().strip()
    check(line.startswith("elected beta"), "after the resignation: %r" % line)
    b.terminate()
    check(b.wait(timeout=10) == 0, "second resign exit code")


def lock_keys(name):
    st, js = any_req("GET", "/v1/kv?prefix=%s/" % name)
    check(st == 200, "scan %s/: %s %r" % (name, st, js))
    return [it["key"] for it in js["items"]]


def wait_keys(name, want, what, timeout=10.0):
    """Polls until the scan of name/ holds `want` keys. Returns the keys and
    the seconds it took."""
    t0 = time.time()
    while True:
        keys = lock_keys(name)
        if len(keys) == want:
            return keys, time.time() - t0
        check(time.time() - t0 < timeout, "%s: %d keys after %.0f s, want %d: %r" %
              (what, len(keys), timeout, want, keys))
        time.sleep(0.05)


def test_signals_release_at_once():
    if CLI is None:
        print("     skipped: no tierkv binary given", flush=True)
        return
    base = [CLI, "-e", endpoints()]
    holder = subprocess.Popen(base + ["lock", "--ttl", "30s", "sig", "--", "sleep", "60"])
    wait_keys("sig", 1, "the holder's key")
    waiter = subprocess.Popen(base + ["lock", "--ttl", "30s", "sig", "--", "true"])
    wait_keys("sig", 2, "the waiter's key")
    time.sleep(0.3)  # let it reach its watch (the test holds either way)
    waiter.send_signal(2)
    code = waiter.wait(timeout=10)
    check(code == 130, "a waiting lock given SIGINT exits %r, want 130" % code)
    _, took_w = wait_keys("sig", 1, "the waiter's key after SIGINT")
    holder.terminate()  # SIGTERM to lock alone: sleep gets it from lock
    code = holder.wait(timeout=10)
    check(code == 143, "a holding lock given SIGTERM exits %r, want 143" % code)
    _, took_h = wait_keys("sig", 0, "the holder's key after SIGTERM")
    a = subprocess.Popen(base + ["elect", "--ttl", "30s", "sigboss", "alpha"],
                         stdout=subprocess.PIPE, text=True)
    check(a.stdout.readline().startswith("elected alpha"), "elect alpha")
    b = subprocess.Popen(base + ["elect", "--ttl", "30s", "sigboss", "beta"],
                         stdout=subprocess.PIPE, text=True)
    check(b.stdout.readline().strip() == "leader alpha", "beta sees alpha")
    b.send_signal(2)
    code = b.wait(timeout=10)
    check(code == 130, "a waiting candidate given SIGINT exits %r, want 130" % code)
    _, took_e = wait_keys("sigboss", 1, "the candidate's key after SIGINT")
    a.terminate()
    check(a.wait(timeout=10) == 0, "the leader resigns with 0")
    wait_keys("sigboss", 0, "the leader's key")
    print("     keys gone after the signal (TTL 30 s): waiting lock %.2f s, holding lock "
          "%.2f s, waiting candidate %.2f s" % (took_w, took_h, took_e), flush=True)


def main():
    global C, CLI
    C = Cluster(sys.argv[1])
    CLI = sys.argv[2] if len(sys.argv) > 2 else None
    C.start()
    C.wait_leader()
    failed = run([test_lease_api, test_check_sections_rejects_bad_files,
                  test_lock_four_processes, test_elect_takeover,
                  test_signals_release_at_once,
                  test_expiry_across_three_leader_kills, test_restart_keeps_leases])
    if not failed:
        codes = C.stop()
        if not all(c == 0 for c in codes.values()):
            print("FAIL graceful stop: exit codes %r" % codes)
            failed = 1
    finish(C, failed)


if __name__ == "__main__":
    main()
