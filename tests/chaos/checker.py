#!/usr/bin/env python3
"""Checks a chaos history (tests/chaos/README.md describes the format).

Checks, each reported separately:
  linearizable   per-key register histories (read, write, cas) admit a
                 linearization: the Wing-Gong search with Lowe's memo (the
                 algorithm of Porcupine), one key at a time (P-compositionality).
                 An `info` op (unknown outcome) may take effect at any point
                 after its invoke, or never (linearizing it after every other
                 op is the same as never applying it).
  acked-writes   after the run, each register's version is at least the
                 number of acknowledged writes and successful CASes to it, and
                 at most that plus the unknown ones; each counter holds at
                 least the number of acknowledged increments.
  idempotency    each Idempotency-Key took effect at most once: repeats of a
                 key answer the same value, distinct keys never share a value,
                 a counter never exceeds acked + unknown increments, and
                 values respect real-time order.
  convergence    every node reported the same state (digest or full scan) at
                 the end.
  recovery       after the fault healed, a write succeeded within the bound.
  watch-order    a watcher received a revision after a later one;
  watch-dup      ... the same event twice (across its resumptions too);
  watch-gap      ... missed an event of the committed history (a node's
                 change log read at the end) for its range, between the
                 revision it started at and the last one it saw whole;
  watch-phantom  ... an event that history does not hold.

Usage: checker.py HISTORY.jsonl [--json] [--budget N] [--recovery-s S]
Exit status: 0 valid, 1 a violation, 2 bad input or inconclusive search.
Standard library only.
"""
import argparse
import json
import re
import sys

INF = float("inf")


class BadHistory(Exception):
    pass


# ---- reading -------------------------------------------------------------


class Op:
    __slots__ = ("id", "client", "f", "key", "inv", "ret", "call", "end",
                 "status", "error")

    def __init__(self, oid, client, f, key, inv):
        self.id = oid
        self.client = client
        self.f = f
        self.key = key
        self.inv = inv      # the invoke event (dict)
        self.ret = None     # the completion event (dict) or None (never completed)
        self.call = inv["time"]
        self.end = INF
        self.status = "info"
        self.error = None

    def __repr__(self):
        r = self.ret or {}
        return ("%s %s key=%s in=%s out=%s [%s..%s] client=%s%s" %
                (self.status, self.f, self.key,
                 _short(self.inv.get("value")), _short(_out(self, r)),
                 _t(self.call), _t(self.end), self.client,
                 (" err=" + str(self.error)) if self.error else ""))


def _short(v):
    s = json.dumps(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _t(x):
    return "inf" if x == INF else "%.3f" % (x / 1e9)


def _out(op, r):
    if op.f == "read":
        return [r.get("value"), r.get("version")]
    if op.f == "cas":
        return {"expect": op.inv.get("expect")}
    return r.get("value")


def load(lines):
    """Pairs events into ops. Returns (ops, meta) where meta holds node-state,
    heal and run lines."""
    ops = []
    meta = {"nodes": [], "heals": [], "run": None}
    open_by_client = {}
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            ev = json.loads(line)
        except ValueError as e:
            raise BadHistory("line %d: not JSON: %s" % (n, e))
        if not isinstance(ev, dict) or "type" not in ev:
            raise BadHistory("line %d: not an event object" % n)
        t = ev["type"]
        if t == "node-state":
            meta["nodes"].append(ev)
            continue
        if t == "heal":
            meta["heals"].append(ev)
            continue
        if t in WATCH_TYPES:
            meta.setdefault("watch", []).append(ev)
            continue
        if t in ("run", "fault", "note"):
            if t == "run":
                meta["run"] = ev
            if t == "fault":
                meta.setdefault("faults", []).append(ev)
            continue
        if t not in ("invoke", "ok", "fail", "info"):
            raise BadHistory("line %d: unknown type %r" % (n, t))
        c = ev.get("client")
        if c is None or not isinstance(ev.get("time"), (int, float)):
            raise BadHistory("line %d: needs client and time" % n)
        if t == "invoke":
            if c in open_by_client:
                raise BadHistory("line %d: client %s invokes with an op still open" % (n, c))
            f = ev.get("f")
            if f not in ("read", "write", "cas", "incr"):
                raise BadHistory("line %d: unknown f %r" % (n, f))
            if "key" not in ev:
                raise BadHistory("line %d: no key" % n)
            op = Op(len(ops), c, f, ev["key"], ev)
            ops.append(op)
            open_by_client[c] = op
        else:
            op = open_by_client.pop(c, None)
            if op is None:
                raise BadHistory("line %d: %s for client %s with no open op" % (n, t, c))
            if ev.get("f", op.f) != op.f or ev.get("key", op.key) != op.key:
                raise BadHistory("line %d: completion does not match its invoke" % n)
            if ev["time"] < op.call:
                raise BadHistory("line %d: completes before it was invoked" % n)
            op.ret = ev
            op.status = t
            op.error = ev.get("error")
            if t != "info":
                op.end = ev["time"]
    # ops still open at the end stay `info` with end = INF
    return ops, meta


# ---- the register model and the search ------------------------------------
#
# State: (value, version); version 0 means absent (value None). A write sets
# the value and bumps the version; cas(expect, x) does so only when version ==
# expect; a read must see exactly the state. This is tierkv's model (kv/cmd.c:
# put on a live key increments the version, on an absent key sets it to 1;
# if_version compares against 0 for an absent key).

R_READ, R_WRITE, R_CAS_OK, R_CAS_MISMATCH, R_CAS_INFO = range(5)

# The value an unobserved write leaves: no read returns it (reads return a
# string or None), so a read right after such a write fails, as it must.
UNOBSERVED = ("<unobserved>",)


def _reg_step(state, kind, a, b, want):
    """One step of the register model; None if the op cannot happen in
    `state`. `want` is the version the op's written value was observed at
    (0 if never observed): values are unique per key, so a write whose value
    a read saw at version v can only be the v-th applied write."""
    value, version = state
    if kind == R_READ:
        return state if (a == value and b == version) else None
    if kind == R_WRITE:
        if want and version + 1 != want:
            return None
        return (b, version + 1)
    if kind == R_CAS_OK:
        if version != a or (want and version + 1 != want):
            return None
        return (b, version + 1)
    if kind == R_CAS_MISMATCH:
        return state if version != a else None
    # R_CAS_INFO (linearized here, so taking effect here): applies when the
    # version matches, else it is a no-op.
    if version == a:
        if want and version + 1 != want:
            return None
        return (b, version + 1)
    return state


class Entry:
    __slots__ = ("is_call", "op", "match", "prev", "next", "id", "time")

    def __init__(self, is_call, op, oid, time):
        self.is_call = is_call
        self.op = op      # (kind, a, b, want, prereq, is_info) for calls
        self.id = oid
        self.time = time
        self.match = None
        self.prev = None
        self.next = None


class SearchResult:
    def __init__(self, ok, steps, detail=None, inconclusive=False):
        self.ok = ok
        self.steps = steps
        self.detail = detail
        self.inconclusive = inconclusive


def _reg_ops(ops):
    """Turns one key's ops into [kind, a, b, call, end, op] for the search.
    Reads that did not complete and definite failures (other than a CAS
    compare failure) have no effect and are dropped. For a write a = None,
    b = the value; for a CAS a = the expected version, b = the value."""
    out = []
    for op in ops:
        inv = op.inv
        if op.f == "read":
            if op.status != "ok":
                continue
            r = op.ret
            out.append([R_READ, r.get("value"), int(r.get("version", 0)), op.call, op.end, op])
        elif op.f == "write":
            if op.status == "fail":
                continue
            out.append([R_WRITE, None, inv.get("value"), op.call, op.end, op])
        elif op.f == "cas":
            e = int(inv.get("expect"))
            if op.status == "ok":
                out.append([R_CAS_OK, e, inv.get("value"), op.call, op.end, op])
            elif op.status == "fail":
                if op.error == "compare_failed":
                    out.append([R_CAS_MISMATCH, e, None, op.call, op.end, op])
            else:
                out.append([R_CAS_INFO, e, inv.get("value"), op.call, op.end, op])
    return out


def _precheck(rops):
    """Cheap, clearly explained violations found before the search: a read
    of a value no write carried, a read that returned before the write of
    its value began, one value seen at two versions. Also computes, per
    written value, the version reads saw it at."""
    writers = {}
    for r in rops:
        if r[0] in (R_WRITE, R_CAS_OK, R_CAS_INFO):
            writers.setdefault(r[2], []).append(r)
    seen_at = {}
    problems = []
    for r in rops:
        if r[0] != R_READ or r[1] is None:
            continue
        val, ver, op = r[1], r[2], r[5]
        ws = writers.get(val)
        if not ws:
            problems.append("read of a value no write carried: %r" % op)
            continue
        if all(r[4] < w[3] for w in ws):
            problems.append("read returned before the write of its value began: %r / %r" %
                            (op, ws[0][5]))
            continue
        if val in seen_at and seen_at[val] != ver and len(ws) == 1:
            problems.append("value %r read at versions %d and %d" % (val, seen_at[val], ver))
            continue
        seen_at[val] = ver
    # Values written more than once give no unique version.
    want = {v: ver for v, ver in seen_at.items() if len(writers.get(v, ())) == 1}
    return problems, want, set(seen_at)


def check_register(ops, budget=2_000_000):
    """Lowe's just-in-time linearization search with memoization over
    (linearized set, state). `budget` caps the number of steps.

    Sound reductions keep it fast when outcomes are unknown:
    - an op whose value a read saw at version v must make version v;
    - a value nobody read is replaced by UNOBSERVED, so states that differ
      only by it are one cache entry;
    - unknown-outcome writes whose value nobody read are interchangeable
      (they only bump the version): they are linearized in the order of
      their invocations, and tried after the other candidates.
    The search ends with success once only unknown ops are left (those never
    took effect)."""
    rops = _reg_ops(ops)
    if not rops:
        return SearchResult(True, 0)
    problems, want, seen = _precheck(rops)
    if problems:
        return SearchResult(False, 0, {"reason": problems[0], "longest_prefix": 0,
                                       "stuck_op": None, "state_then": None,
                                       "all": problems})
    prev_unobs = -1
    prereq = [-1] * len(rops)
    is_info = [r[4] == INF for r in rops]
    for i in sorted(range(len(rops)), key=lambda i: rops[i][3]):
        r = rops[i]
        if r[0] in (R_WRITE, R_CAS_OK, R_CAS_INFO) and r[2] not in seen:
            r[2] = UNOBSERVED
            if r[0] == R_WRITE and is_info[i]:
                prereq[i] = prev_unobs
                prev_unobs = i
    n_definite = sum(1 for x in is_info if not x)
    events = []
    for i, r in enumerate(rops):
        # At equal times calls sort before returns: the ops count as
        # concurrent, which never invents a violation.
        events.append((r[3], 0, i, True))
        events.append((r[4], 1, i, False))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    head = Entry(False, None, -1, 0)
    prev = head
    calls = {}
    for time, _, i, is_call in events:
        r = rops[i]
        w = want.get(r[2], 0) if r[0] != R_READ else 0
        e = Entry(is_call, (r[0], r[1], r[2], w, prereq[i], is_info[i]) if is_call else None,
                  i, time)
        if is_call:
            calls[i] = e
        else:
            calls[i].match = e
        e.prev = prev
        prev.next = e
        prev = e

    def lift(e):
        e.prev.next = e.next
        if e.next:
            e.next.prev = e.prev
        m = e.match
        m.prev.next = m.next
        if m.next:
            m.next.prev = m.prev

    def unlift(e):
        m = e.match
        m.prev.next = m
        if m.next:
            m.next.prev = m
        e.prev.next = e
        if e.next:
            e.next.prev = e

    def candidates():
        """The calls that may be linearized next: those before the first
        return still in the list, in invocation order, except that unknown
        writes nobody read come last (most of them never took effect).
        (Deferring unknown CASes too made real histories slower: the order
        changes only how fast a linearization is found, never which exist.)"""
        d = []
        u = []
        e = head.next
        while e is not None and e.is_call:
            (u if e.op[5] and e.op[0] == R_WRITE and e.op[2] is UNOBSERVED else d).append(e)
            e = e.next
        return d + u, e

    state = (None, 0)
    linearized = 0
    left = n_definite
    cache = set()
    stack = []
    steps = 0
    best_depth = -1
    best_stuck = None
    best_state = None
    cands, first_ret = candidates()
    i = 0
    while left > 0:
        steps += 1
        if steps > budget:
            return SearchResult(False, steps, {"reason": "search budget exhausted"},
                                inconclusive=True)
        if i < len(cands):
            entry = cands[i]
            i += 1
            kind, a, b, w, pre, info = entry.op
            if pre >= 0 and not (linearized >> pre) & 1:
                continue
            ns = _reg_step(state, kind, a, b, w)
            if ns is None:
                continue
            nl = linearized | (1 << entry.id)
            k = (nl, ns)
            if k in cache:
                continue
            cache.add(k)
            stack.append((cands, i, first_ret, entry, state))
            state = ns
            linearized = nl
            if not info:
                left -= 1
            lift(entry)
            cands, first_ret = candidates()
            i = 0
            continue
        # Every candidate failed before the return `first_ret`: backtrack.
        if len(stack) > best_depth:
            best_depth = len(stack)
            best_stuck = first_ret.id if first_ret is not None else None
            best_state = state
        if not stack:
            op = rops[best_stuck][5] if best_stuck is not None else None
            return SearchResult(False, steps, {
                "reason": "no linearization",
                "longest_prefix": best_depth,
                "stuck_op": repr(op) if op else None,
                "state_then": ["<a value no read saw>" if best_state[0] is UNOBSERVED
                               else best_state[0], best_state[1]] if best_state else None,
            })
        cands, i, first_ret, top, state = stack.pop()
        linearized &= ~(1 << top.id)
        if not top.op[5]:
            left += 1
        unlift(top)
    return SearchResult(True, steps)


# ---- counters and idempotency ---------------------------------------------


def check_counters(ops, final_reads):
    """ops: incr ops of all counters. final_reads: {key: value} from the end
    of the run (may miss keys). Returns a list of violation strings."""
    v = []
    by_key = {}
    for op in ops:
        if op.f == "incr":
            by_key.setdefault(op.key, []).append(op)
    for key in final_reads:
        by_key.setdefault(key, [])
    for key, kops in sorted(by_key.items()):
        by_idem = {}
        for op in kops:
            idem = op.inv.get("idem")
            if idem is None:
                raise BadHistory("incr without an idem key: %r" % op)
            by_idem.setdefault(idem, []).append(op)
        acked = {}      # idem -> value
        unknown = set()
        for idem, iops in by_idem.items():
            vals = set()
            for op in iops:
                if op.status == "ok":
                    vals.add(int(op.ret.get("value")))
            if len(vals) > 1:
                v.append("idempotency: key %s idem %s answered different values %s "
                         "(applied more than once)" % (key, idem, sorted(vals)))
            if vals:
                acked[idem] = min(vals)
            elif any(op.status == "info" for op in iops):
                unknown.add(idem)
        owners = {}
        for idem, val in acked.items():
            if val in owners:
                v.append("idempotency: key %s value %d answered to two idem keys %s "
                         "and %s (lost or duplicated increment)" % (key, val, owners[val], idem))
            owners[val] = idem
        # Real-time order: an increment that returned before another began
        # has a smaller value. An idempotency key is one logical op: it may
        # take effect from its first attempt's call to its first ok's end.
        logical = []
        for idem, val in acked.items():
            iops = by_idem[idem]
            call = min(o.call for o in iops)
            end = min(o.end for o in iops if o.status == "ok")
            logical.append((call, end, val, idem))
        by_end = sorted(logical, key=lambda x: x[1])
        j = 0
        best = None
        for call, end, val, idem in sorted(logical):
            while j < len(by_end) and by_end[j][1] < call:
                if best is None or by_end[j][2] > best[2]:
                    best = by_end[j]
                j += 1
            if best is not None and val <= best[2]:
                v.append("idempotency: counter %s: incr %s returned %d but incr %s had "
                         "already returned %d before it began (not linearizable)" %
                         (key, idem, val, best[3], best[2]))
                break
        if key in final_reads:
            fv = final_reads[key]
            lo, hi = len(acked), len(acked) + len(unknown)
            if fv < lo:
                v.append("acked-writes: counter %s ends at %d but %d increments were "
                         "acknowledged (lost writes)" % (key, fv, lo))
            if acked and fv < max(acked.values()):
                v.append("acked-writes: counter %s ends at %d below the acknowledged "
                         "value %d (lost writes)" % (key, fv, max(acked.values())))
            if fv > hi:
                v.append("idempotency: counter %s ends at %d but at most %d increments "
                         "(%d acked + %d unknown) may have applied (duplicate apply)" %
                         (key, fv, hi, lo, len(unknown)))
        if acked and max(acked.values()) > len(acked) + len(unknown):
            v.append("idempotency: counter %s answered %d with at most %d distinct "
                     "increments issued" % (key, max(acked.values()), len(acked) + len(unknown)))
    return v


# ---- violation kinds -------------------------------------------------------
#
# Every violation is one string "KIND: ...", KIND one of KINDS; those about
# one key name it right after the kind: "KIND: key K ..." (a register, or the
# counter of an idempotency violation) or "KIND: counter K ...". Self-tests
# (selftest.py, meson.build, run --expect-violation) match on these two
# fields, never on free text.

KINDS = ("linearizability", "acked-writes", "idempotency", "convergence", "recovery",
         "watch-order", "watch-dup", "watch-gap", "watch-phantom")
_KIND_RE = re.compile(r"^([a-z][a-z-]*): (?:(?:key|counter) ([^\s:]+))?")


def violation_kind(v):
    """The kind of a violation string ("linearizability", ...), or None."""
    m = _KIND_RE.match(v)
    return m.group(1) if m else None


def violation_key(v):
    """The key (register or counter) a violation is about, or None."""
    m = _KIND_RE.match(v)
    return m.group(2) if m else None


def violation_matches(v, spec):
    """spec is "KIND" or "KIND:KEY": the violation is of that kind (and
    about that key)."""
    kind, _, key = spec.partition(":")
    return violation_kind(v) == kind and (not key or violation_key(v) == key)


# ---- watches ---------------------------------------------------------------

WATCH_TYPES = ("watch-start", "watch", "watch-resume", "watch-end", "changelog",
               "changelog-range")


def _in_range(rng, key):
    kind, _, v = rng.partition("=")
    if kind == "key":
        return key == v
    if kind == "prefix":
        return key.startswith(v)
    raise BadHistory("watch range %r" % rng)


def check_watches(lines):
    """The watchers' streams against the committed history (the runner's
    `changelog` lines, a node's change log over `changelog-range`)."""
    v = []
    ref, span, ws = [], None, {}
    for ev in lines:
        t = ev["type"]
        if t == "changelog":
            ref.append((ev["rev"], ev["ev"], ev["key"], ev.get("value")))
        elif t == "changelog-range":
            span = (ev["from"], ev["to"])
        else:
            w = ws.setdefault(ev.get("watcher"), {"range": None, "from": 1, "events": [],
                                                   "complete": 0})
            if t == "watch-start":
                w["range"], w["from"] = ev["range"], ev.get("from", 1)
            elif t == "watch":
                w["events"].append((ev["rev"], ev["ev"], ev["key"], ev.get("value")))
            elif t == "watch-end":
                w["complete"] = ev["complete"]
    for wid in sorted(ws, key=str):
        w = ws[wid]
        if w["range"] is None:
            raise BadHistory("watcher %s has no watch-start" % wid)
        last, seen = 0, set()
        for e in w["events"]:
            if e[0] < last:
                v.append("watch-order: watcher %s received revision %d after %d" %
                         (wid, e[0], last))
            if e[:3] in seen:
                v.append("watch-dup: watcher %s received %s %s at revision %d twice" %
                         (wid, e[1], e[2], e[0]))
            seen.add(e[:3])
            last = max(last, e[0])
        if span is None:
            continue
        lo, hi = max(span[0], w["from"]), min(span[1], w["complete"])
        want = [e for e in ref if lo <= e[0] <= hi and _in_range(w["range"], e[2])]
        got = set(e for e in w["events"] if lo <= e[0] <= hi)
        missing = [e for e in want if e not in got]
        if missing:
            v.append("watch-gap: watcher %s missed %d of %d events in revisions %d..%d, "
                     "first %r" % (wid, len(missing), len(want), lo, hi, missing[0]))
        extra = got - set(want)
        if extra:
            v.append("watch-phantom: watcher %s received %d events the history does not "
                     "hold, first %r" % (wid, len(extra), min(extra)))
    return v


# ---- the whole history -----------------------------------------------------


def check(lines, budget=2_000_000, recovery_s=10.0):
    ops, meta = load(lines)
    res = {"ops": len(ops), "ok": 0, "fail": 0, "info": 0, "violations": [],
           "inconclusive": [], "keys": 0, "search_steps": 0}
    for op in ops:
        res[op.status] += 1
    if ops:
        span = (max(o.end if o.end != INF else o.call for o in ops) -
                min(o.call for o in ops)) / 1e9
        res["span_s"] = round(span, 3)
        res["ops_per_s"] = round(len(ops) / span, 1) if span > 0 else 0
    regs = {}
    incrs = []
    for op in ops:
        if op.f == "incr" or op.inv.get("counter"):
            incrs.append(op)
        else:
            regs.setdefault(op.key, []).append(op)
    res["keys"] = len(regs)
    # linearizability, per key
    for key in sorted(regs):
        kops = regs[key]
        r = check_register(kops, budget)
        res["search_steps"] += r.steps
        if r.inconclusive:
            res["inconclusive"].append("key %s: %s after %d steps" %
                                       (key, r.detail["reason"], r.steps))
        elif not r.ok:
            d = r.detail
            if d["reason"] != "no linearization":
                res["violations"].append("linearizability: key %s: %s" % (key, d["reason"]))
                continue
            res["violations"].append(
                "linearizability: key %s has no linearization (longest prefix %d ops; "
                "stuck at: %s; register then: %s)" %
                (key, d["longest_prefix"], d["stuck_op"], d["state_then"]))
    # acknowledged writes present at the end: the final reads
    final = {}
    final_counter = {}
    for op in ops:
        if op.inv.get("final") and op.status == "ok" and op.f == "read":
            if op.inv.get("counter"):
                val = op.ret.get("value")
                final_counter[op.key] = int(val) if val is not None else 0
            else:
                final[op.key] = int(op.ret.get("version", 0))
    for key, kops in sorted(regs.items()):
        if key not in final:
            continue
        acked = sum(1 for o in kops if o.status == "ok" and o.f in ("write", "cas"))
        unknown = sum(1 for o in kops if o.status == "info" and o.f in ("write", "cas"))
        if final[key] < acked:
            res["violations"].append(
                "acked-writes: key %s ends at version %d but %d writes were acknowledged "
                "(lost writes)" % (key, final[key], acked))
        if final[key] > acked + unknown:
            res["violations"].append(
                "acked-writes: key %s ends at version %d but at most %d writes may have "
                "applied (a failed write applied, or one applied twice)" %
                (key, final[key], acked + unknown))
    # counters
    res["violations"].extend(check_counters(incrs, final_counter))
    # watches
    res["violations"].extend(check_watches(meta.get("watch", [])))
    res["watch_lines"] = len(meta.get("watch", []))
    # convergence
    nodes = meta["nodes"]
    if nodes:
        fps = {}
        for n in nodes:
            fp = n.get("digest")
            if fp is None:
                fp = json.dumps(n.get("items"), sort_keys=True)
            fps[n.get("node")] = fp
        if len(set(fps.values())) > 1:
            short = {k: (v if len(v) < 24 else v[:20] + "...") for k, v in fps.items()}
            res["violations"].append("convergence: nodes differ at the end: %s" % short)
        res["nodes_compared"] = len(fps)
    # recovery after heal
    for h in meta["heals"]:
        t = h["time"]
        firsts = [o.end for o in ops if o.status == "ok" and o.f in ("write", "cas", "incr")
                  and o.call >= t]
        if not firsts:
            res["violations"].append("recovery: no write succeeded after the heal at %s" % _t(t))
        else:
            dt = (min(firsts) - t) / 1e9
            res.setdefault("recovery_s", []).append(round(dt, 3))
            if dt > recovery_s:
                res["violations"].append("recovery: first write after the heal took %.1f s "
                                         "(> %.0f s)" % (dt, recovery_s))
    # recovery after each intermediate heal: a violation only when the next
    # fault left at least `recovery_s` of healthy time
    fl = sorted(meta.get("faults", []), key=lambda e: e["time"])
    worst = None
    for k, ev in enumerate(fl):
        if ev.get("action") != "heal":
            continue
        t = ev["time"]
        nxt = next((e["time"] for e in fl[k + 1:] if e.get("action") == "start"), INF)
        firsts = [o.end for o in ops if o.status == "ok" and o.f in ("write", "cas", "incr")
                  and o.call >= t]
        dt = (min(firsts) - t) / 1e9 if firsts else INF
        if dt != INF and (worst is None or dt > worst):
            worst = dt
        if dt > recovery_s and (nxt - t) / 1e9 > recovery_s:
            res["violations"].append("recovery: no write succeeded within %.0f s of the heal "
                                     "at %s (%s)" % (recovery_s, _t(t), ev.get("kind")))
    if worst is not None:
        res["worst_heal_recovery_s"] = round(worst, 3)
    if res["violations"]:
        res["verdict"] = "FAIL"
    elif res["inconclusive"]:
        res["verdict"] = "UNKNOWN"
    else:
        res["verdict"] = "PASS"
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("history")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--budget", type=int, default=2_000_000,
                    help="search steps per key before giving up (default 2M)")
    ap.add_argument("--recovery-s", type=float, default=10.0)
    ap.add_argument("--expect", choices=["pass", "fail"],
                    help="exit 0 only if the verdict is this (for self-tests)")
    ap.add_argument("--expect-violation", default=None, metavar="KIND[:KEY]",
                    help="with --expect fail: some violation must be of this kind "
                         "(%s), and about this key if given" % ", ".join(KINDS))
    ap.add_argument("--allow-violation", action="append", default=[], metavar="KIND",
                    help="with --expect-violation: another kind that may also be reported "
                         "(any kind not expected or allowed makes the self-test fail)")
    a = ap.parse_args(argv)
    try:
        with open(a.history) as f:
            res = check(f, a.budget, a.recovery_s)
    except (BadHistory, OSError, KeyError, TypeError, ValueError) as e:
        print("checker: bad history: %s" % e, file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(res))
    else:
        print("ops %d ok %d fail %d info %d keys %d steps %d violations %d verdict %s" %
              (res["ops"], res["ok"], res["fail"], res["info"], res["keys"],
               res["search_steps"], len(res["violations"]), res["verdict"]))
        for v in res["violations"]:
            print("  violation: " + v)
        for v in res["inconclusive"]:
            print("  inconclusive: " + v)
    if a.expect:
        got = "pass" if res["verdict"] == "PASS" else "fail"
        if got != a.expect:
            print("checker: expected %s, got %s" % (a.expect, res["verdict"]), file=sys.stderr)
            return 1
        if a.expect == "fail" and a.expect_violation:
            kind = a.expect_violation.partition(":")[0]
            if kind not in KINDS:
                print("checker: unknown violation kind %r (one of %s)" %
                      (kind, ", ".join(KINDS)), file=sys.stderr)
                return 2
            if not any(violation_matches(v, a.expect_violation) for v in res["violations"]):
                print("checker: no %s violation" % a.expect_violation, file=sys.stderr)
                return 1
            allowed = {kind} | set(a.allow_violation)
            other = [v for v in res["violations"] if violation_kind(v) not in allowed]
            if other:
                print("checker: violations of an unexpected kind: %s" % other, file=sys.stderr)
                return 1
        return 0
    return {"PASS": 0, "FAIL": 1}.get(res["verdict"], 2)


if __name__ == "__main__":
    sys.exit(main())
