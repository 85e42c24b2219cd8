#!/usr/bin/env python3
"""One chaos watcher: follows GET /v1/watch on the nodes while faults run and
logs what it received as JSON lines (tests/chaos/README.md, "History format").

It starts at revision 1 on its first node and resumes after any break (a
killed or cut-off node, a lagging cancellation) from the revision after the
last one it saw whole, on the next node that holds it. A revision counts as
whole once the next revision or a progress frame (asked for every 200 ms)
arrived; the events of a revision it saw only partly are dropped and come
again. Lines:
  {"type":"watch-start","watcher":W,"range":R,"from":1}
  {"type":"watch","watcher":W,"node":N,"rev":R,"ev":"put","key":K,"value":V}
  {"type":"watch-resume","watcher":W,"from":R,"why":...}
  {"type":"watch-end","watcher":W,"complete":R}   (every revision <= R seen)
Stops once --stop-file holds a revision it has seen whole (or 15 s after
the file appears). Also read_changelog(), the runner's reference history.

Usage: watcher.py --id W --nodes "1=host:port,..." --first N --range prefix=r
                  --out FILE --stop-file PATH
Standard library only.
"""
import argparse
import http.client
import json
import os
import time


def _events(host, port, query, start, timeout, on_event, on_progress, stop):
    """Streams a watch; calls on_event(rev, ev, key, value) and
    on_progress(rev); returns why it ended."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("GET", "/v1/watch?%s&start_revision=%d&progress_ms=200" % (query, start))
        r = c.getresponse()
        if r.status != 200:
            return "status %d %s" % (r.status, r.read()[:200].decode("utf-8", "replace"))
        while not stop():
            line = r.readline()
            if not line:
                return "eof"
            ev = json.loads(line)
            if "progress" in ev:
                on_progress(ev["progress"]["revision"])
            elif "error" in ev:
                return "error %s" % json.dumps(ev["error"])
            else:
                on_event(ev["revision"], ev["type"], ev["key"], ev.get("value"))
        return "stopped"
    except (OSError, http.client.HTTPException, ValueError) as e:
        return "broken: %s" % type(e).__name__
    finally:
        c.close()


def read_changelog(host, port, until, timeout=10, log=None):
    """A node's change log from the oldest revision it holds up to `until`:
    (first, [(rev, ev, key, value)]), or None."""
    first = 1
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("GET", "/v1/watch?prefix=&start_revision=1")
        r = c.getresponse()
        body = r.read() if r.status == 410 else b""
        if r.status == 410:
            first = json.loads(body)["error"]["compact_revision"] + 1
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        if log is not None:
            log("change log of %s:%d: %r" % (host, port, e))
        return None
    finally:
        c.close()
    out, done = [], [False]

    def prog(rev):
        done[0] = rev >= until

    why = _events(host, port, "prefix=", first, timeout,
                  lambda *e: out.append(e), prog, lambda: done[0])
    if not done[0]:
        if log is not None:
            log("change log of %s:%d: %s (read %d events, up to %d wanted)" %
                (host, port, why, len(out), until))
        return None
    return first, [e for e in out if e[0] <= until]


class Watcher:
    def __init__(self, a):
        self.id = a.id
        self.nodes = {}
        for item in a.nodes.split(","):
            nid, addr = item.split("=")
            host, port = addr.rsplit(":", 1)
            self.nodes[int(nid)] = (host, int(port))
        ids = sorted(self.nodes)
        k = ids.index(a.first) if a.first in ids else 0
        self.order = ids[k:] + ids[:k]
        self.range = a.range
        self.out = open(a.out, "a", buffering=1)
        self.stop_file = a.stop_file
        self.complete = 0
        self.pending = []
        self.node = None
        self.stop_seen = None

    def log(self, ev):
        ev["watcher"] = self.id
        ev["time"] = time.monotonic_ns()
        self.out.write(json.dumps(ev, separators=(",", ":")) + "\n")

    def whole(self, upto):
        for rev, ev, key, value in self.pending:
            self.log({"type": "watch", "node": self.node, "rev": rev, "ev": ev, "key": key,
                      "value": value})
        self.pending = []
        self.complete = max(self.complete, upto)

    def on_event(self, rev, ev, key, value):
        if self.pending and self.pending[0][0] != rev:
            self.whole(self.pending[0][0])
        self.pending.append((rev, ev, key, value))

    def on_progress(self, rev):
        if self.pending:
            self.whole(self.pending[0][0])
        self.complete = max(self.complete, rev)

    def should_stop(self):
        if not os.path.exists(self.stop_file):
            return False
        if self.stop_seen is None:
            self.stop_seen = time.monotonic()
        try:
            with open(self.stop_file) as f:
                target = int(f.read().strip() or "0")
        except (OSError, ValueError):
            target = 0
        return (target > 0 and self.complete >= target) or \
            time.monotonic() - self.stop_seen > 15

    def run(self):
        self.log({"type": "watch-start", "range": self.range, "from": 1})
        i = 0
        while not self.should_stop():
            nid = self.order[i % len(self.order)]
            i += 1
            self.node = nid
            host, port = self.nodes[nid]
            why = _events(host, port, self.range, self.complete + 1, 2, self.on_event,
                          self.on_progress, self.should_stop)
            self.pending = []  # a revision not seen whole comes again
            if why != "stopped":
                self.log({"type": "watch-resume", "from": self.complete + 1, "why": why})
                time.sleep(0.1)
        self.log({"type": "watch-end", "complete": self.complete})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--id", type=int, required=True)
    ap.add_argument("--nodes", required=True)
    ap.add_argument("--first", type=int, default=1)
    ap.add_argument("--range", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stop-file", required=True)
    Watcher(ap.parse_args()).run()


if __name__ == "__main__":
    main()
