#!/usr/bin/env python3
"""One chaos workload client: drives tierkvd nodes over HTTP and logs every
operation as JSON lines (tests/chaos/README.md, "History format").

Operations: on registers r0..r{K-1}: read (linearizable GET), write (PUT of a
value unique to this client), cas (PUT {"value", "if_version"} with the
version this client last saw); on counters c0..c{C-1}: incr (POST .../incr
with an Idempotency-Key; after an unknown outcome the same key is retried).

Outcomes: 2xx -> ok; 404 on a read -> ok (absent); 409 compare_failed -> fail
(the compare did not hold); 503 -> fail (the node says it did not apply it:
no leader, not leader, lost, busy); a refused or failed connect -> fail (not
sent); 504, a timeout or a broken connection after the request went out ->
info (unknown); any other status -> info, with the status in "error".

Usage: workload.py --client N --nodes "1=host:port,2=..." --seconds S
                   --out FILE [--seed S] [--keys K] [--counters C]
                   [--timeout-s T] [--run-id ID] [--stop-file PATH]
Stops at the deadline or when --stop-file exists. Standard library only.
"""
import argparse
import http.client
import json
import os
import random
import socket
import sys
import time


class Client:
    def __init__(self, a):
        self.id = a.client
        self.nodes = {}
        for item in a.nodes.split(","):
            nid, addr = item.split("=")
            host, port = addr.rsplit(":", 1)
            self.nodes[int(nid)] = (host, int(port))
        self.ids = sorted(self.nodes)
        self.rng = random.Random(a.seed * 1000003 + a.client)
        self.timeout = a.timeout_s
        self.conns = {}
        self.leader = None
        self.out = open(a.out, "a", buffering=1)
        self.keys = ["r%d" % i for i in range(a.keys)]
        self.counters = ["c%d" % i for i in range(a.counters)]
        self.seen_version = {}
        self.seq = 0
        self.run_id = a.run_id
        self.final = a.final
        self.stale_reads = getattr(a, "stale_reads", False)

    def log(self, ev):
        ev["client"] = self.id
        ev["time"] = time.monotonic_ns()
        self.out.write(json.dumps(ev, separators=(",", ":")) + "\n")

    def conn(self, nid):
        c = self.conns.get(nid)
        if c is None:
            host, port = self.nodes[nid]
            c = http.client.HTTPConnection(host, port, timeout=self.timeout)
            self.conns[nid] = c
        return c

    def drop(self, nid):
        c = self.conns.pop(nid, None)
        if c is not None:
            try:
                c.close()
            except OSError:
                pass

    def request(self, nid, method, path, body=None, headers=None):
        """Returns (outcome, status, json_or_None, resp_headers, error) where
        outcome is 'sent' (we have an answer), 'fail' (never sent) or 'info'
        (sent, no answer)."""
        c = self.conn(nid)
        h = dict(headers or {})
        try:
            if c.sock is None:
                c.connect()
        except (OSError, http.client.HTTPException) as e:
            self.drop(nid)
            if self.leader == nid:
                self.leader = None
            return "fail", 0, None, {}, "connect: %s" % type(e).__name__
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            hdrs = {k.lower(): v for k, v in r.getheaders()}
        except (OSError, http.client.HTTPException) as e:
            self.drop(nid)
            if self.leader == nid:
                self.leader = None
            kind = "timeout" if isinstance(e, socket.timeout) else type(e).__name__
            return "info", 0, None, {}, kind
        if hdrs.get("connection", "").lower() == "close":
            self.drop(nid)
        try:
            j = json.loads(data) if data else None
        except ValueError:
            j = None
        lid = hdrs.get("x-tierkv-leader")
        if lid and lid.isdigit() and int(lid) in self.nodes:
            self.leader = int(lid)
        return "sent", r.status, j, hdrs, None

    def pick(self, write):
        if self.leader is not None and (write or self.rng.random() < 0.5):
            return self.leader
        return self.rng.choice(self.ids)

    @staticmethod
    def err_code(j):
        try:
            return j["error"]["code"]
        except (TypeError, KeyError):
            return None

    def classify(self, outcome, status, j, err):
        """-> (type, error) for a write."""
        if outcome == "fail":
            return "fail", err
        if outcome == "info":
            return "info", err
        if 200 <= status < 300:
            return "ok", None
        code = self.err_code(j) or str(status)
        if status == 409 and code == "compare_failed":
            return "fail", "compare_failed"
        if status == 503:
            return "fail", code
        return "info", "%d %s" % (status, code)

    def do_read(self, key, final=False, counter=False, nid=None):
        ev = {"type": "invoke", "f": "read", "key": key}
        if final:
            ev["final"] = True
        if counter:
            ev["counter"] = True
        self.log(dict(ev))
        nid = nid if nid is not None else self.pick(False)
        path = "/v1/kv/" + key
        if self.stale_reads and not final:
            path += "?consistency=stale"
        outcome, status, j, _h, err = self.request(nid, "GET", path)
        done = dict(ev, node=nid)
        if outcome == "sent" and status == 200 and isinstance(j, dict):
            done.update(type="ok", value=j.get("value"), version=int(j.get("version", 0)))
            self.seen_version[key] = done["version"]
        elif outcome == "sent" and status == 404 and self.err_code(j) == "not_found":
            done.update(type="ok", value=None, version=0)
            self.seen_version[key] = 0
        else:
            t, e = self.classify(outcome, status, j, err)
            # A read has no effect; keep fail/info apart for the statistics.
            done.update(type="info" if t == "ok" else t, error=e or "%d" % status)
        self.log(done)
        return done

    def do_write(self, key, nid=None, value=None):
        self.seq += 1
        value = value or "%s-%d-%d" % (self.run_id, self.id, self.seq)
        ev = {"type": "invoke", "f": "write", "key": key, "value": value}
        self.log(dict(ev))
        nid = nid if nid is not None else self.pick(True)
        outcome, status, j, _h, err = self.request(
            nid, "PUT", "/v1/kv/" + key, body=value.encode(),
            headers={"Content-Type": "application/octet-stream"})
        t, e = self.classify(outcome, status, j, err)
        done = dict(ev, type=t, node=nid)
        if e:
            done["error"] = e
        self.log(done)
        return done

    def do_cas(self, key):
        if self.rng.random() < 0.7:
            self.do_read(key)
        self.seq += 1
        value = "%s-%d-%d" % (self.run_id, self.id, self.seq)
        expect = self.seen_version.get(key, 0)
        ev = {"type": "invoke", "f": "cas", "key": key, "expect": expect, "value": value}
        self.log(dict(ev))
        nid = self.pick(True)
        body = json.dumps({"value": value, "if_version": expect}).encode()
        outcome, status, j, _h, err = self.request(
            nid, "PUT", "/v1/kv/" + key, body=body,
            headers={"Content-Type": "application/json"})
        t, e = self.classify(outcome, status, j, err)
        done = dict(ev, type=t, node=nid)
        if e:
            done["error"] = e
        if t == "ok":
            self.seen_version[key] = expect + 1
        self.log(done)

    def do_incr(self, key, retries=3):
        self.seq += 1
        idem = "%s-%d-%d" % (self.run_id, self.id, self.seq)
        for attempt in range(retries + 1):
            ev = {"type": "invoke", "f": "incr", "key": key, "idem": idem}
            if attempt:
                ev["attempt"] = attempt
            self.log(dict(ev))
            nid = self.pick(True)
            outcome, status, j, _h, err = self.request(
                nid, "POST", "/v1/kv/%s/incr" % key, headers={"Idempotency-Key": idem})
            t, e = self.classify(outcome, status, j, err)
            done = dict(ev, type=t, node=nid)
            if e:
                done["error"] = e
            if t == "ok":
                done["value"] = int(j.get("value"))
                if j.get("replayed"):
                    done["replayed"] = True
            self.log(done)
            if t == "ok" or (t == "fail" and e == "compare_failed"):
                return
            # Unknown or refused: retry with the same key (a retried write
            # must apply once).
            time.sleep(0.05)

    def step(self):
        r = self.rng.random()
        if r < 0.15 and self.counters:
            self.do_incr(self.rng.choice(self.counters))
            return
        key = self.rng.choice(self.keys)
        if r < 0.55:
            self.do_read(key)
        elif r < 0.8:
            self.do_write(key)
        else:
            self.do_cas(key)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--client", type=int, required=True)
    ap.add_argument("--nodes", required=True)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keys", type=int, default=10)
    ap.add_argument("--counters", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=3.0)
    ap.add_argument("--run-id", default="w")
    ap.add_argument("--stop-file", default=None)
    ap.add_argument("--stale-reads", action="store_true",
                    help="planted bug for harness self-tests: reads use "
                         "?consistency=stale, which is not linearizable")
    ap.add_argument("--final", action="store_true",
                    help="read every key once (final reads) and exit")
    a = ap.parse_args()
    c = Client(a)
    if a.final:
        # Final reads: linearizable, retried until ok (bounded by --seconds).
        deadline = time.monotonic() + a.seconds
        for key in c.keys + c.counters:
            while time.monotonic() < deadline:
                d = c.do_read(key, final=True, counter=key in c.counters,
                              nid=c.leader if c.leader is not None else None)
                if d["type"] == "ok":
                    break
                time.sleep(0.1)
            else:
                print("workload: final read of %s did not succeed in time" % key,
                      file=sys.stderr)
                return 1
        return 0
    deadline = time.monotonic() + a.seconds
    n = 0
    while time.monotonic() < deadline:
        if a.stop_file and n % 16 == 0 and os.path.exists(a.stop_file):
            break
        c.step()
        n += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
