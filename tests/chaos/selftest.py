#!/usr/bin/env python3
"""Self-tests of the chaos checker (checker.py).

1. Every fixture fixtures/bad-*.jsonl must FAIL with the violation kind its
   name announces (checker.KINDS), about the key it plants the bug in, and
   with no violation of a kind not listed for it; fixtures/good-*.jsonl must
   PASS.
2. Random linearizable histories (a simulated register and counter with
   concurrent clients, unknown outcomes that did or did not apply, CAS that
   succeed or fail, retried idempotent increments) must PASS: the checker
   invents no violation.
3. The same histories, each with one planted bug, must FAIL with that bug's
   kind of violation on the key it was planted in, and nothing else but the
   kinds the bug also implies: a read of a value nobody wrote and a read of a
   stale value after a later write completed -> linearizability; a lost
   acknowledged write in the final read -> acked-writes (a read no
   linearization explains, too); an increment applied twice -> idempotency.
4. A history the size of a long chaos cell must be checked in bounded time.

Usage: selftest.py [--seeds N] [--quiet]. Exit 0 when every case behaves.
"""
import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checker  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# fixture -> (the violation it must report: "KIND" or "KIND:KEY", the other
# kinds it may also report). meson.build runs the same through checker.py
# --expect-violation.
EXPECT = {
    "bad-stale-read": ("linearizability:r0", ()),
    "bad-lost-write": ("acked-writes:r0", ("linearizability",)),
    "bad-read-before-write": ("linearizability:r0", ()),
    "bad-duplicate-idempotent": ("idempotency:c0", ()),
    "bad-duplicate-final": ("idempotency:c0", ()),
    "bad-cas": ("linearizability:r0", ()),
    "bad-failed-write-visible": ("linearizability:r0", ()),
    "bad-divergence": ("convergence", ()),
    "bad-slow-recovery": ("recovery", ()),
    "bad-watch-gap": ("watch-gap", ()),
    "bad-watch-dup": ("watch-dup", ()),
    "bad-watch-order": ("watch-order", ()),
    "bad-watch-phantom": ("watch-phantom", ()),
}


def wrong_violations(res, spec, allowed=()):
    """Why `res` is not a FAIL with a violation matching `spec` and no other
    kind than spec's and `allowed`; None if it is."""
    if res["verdict"] != "FAIL":
        return "verdict %s, not FAIL (%s)" % (res["verdict"], res["inconclusive"])
    if not any(checker.violation_matches(v, spec) for v in res["violations"]):
        return "no %s violation among %s" % (spec, res["violations"])
    ok_kinds = {spec.partition(":")[0]} | set(allowed)
    other = [v for v in res["violations"] if checker.violation_kind(v) not in ok_kinds]
    if other:
        return "violations of an unexpected kind (want %s): %s" % (spec, other)
    return None


def run_check(events):
    import json
    return checker.check([json.dumps(e) for e in events])


def gen_history(rng, n_clients=6, n_keys=3, n_ops=300, p_info=0.05, p_fail=0.03):
    """A history produced by a correct (linearizable) system. Each op gets a
    call time, a linearization point inside its interval and an end; the
    outputs come from applying ops in linearization-point order."""
    ops = []
    t_client = [0] * n_clients
    seq = [0] * n_clients
    for _ in range(n_ops):
        c = rng.randrange(n_clients)
        call = t_client[c] + rng.randrange(1, 50)
        dur = rng.randrange(1, 120)
        end = call + dur
        lin = call + rng.randrange(0, dur + 1)
        t_client[c] = end
        r = rng.random()
        if r < 0.2:
            key = "c%d" % rng.randrange(2)
            seq[c] += 1
            op = {"f": "incr", "key": key, "idem": "%d-%d" % (c, seq[c])}
        else:
            key = "r%d" % rng.randrange(n_keys)
            if r < 0.55:
                op = {"f": "read", "key": key}
            elif r < 0.8:
                seq[c] += 1
                op = {"f": "write", "key": key, "value": "%d-%d" % (c, seq[c])}
            else:
                seq[c] += 1
                op = {"f": "cas", "key": key, "value": "%d-%d" % (c, seq[c]),
                      "expect": None}
        op.update(client=c, call=call, end=end, lin=lin)
        x = rng.random()
        if op["f"] != "read" and x < p_info:
            op["outcome"] = "info"
            op["applies"] = rng.random() < 0.5
        elif op["f"] != "read" and op["f"] != "cas" and x < p_info + p_fail:
            op["outcome"] = "fail"
            op["applies"] = False
        else:
            op["outcome"] = "ok"
            op["applies"] = True
        ops.append(op)
    # CAS expectations: the version a client last saw, sometimes stale.
    regs = {}
    counters = {}
    idem_val = {}
    for op in sorted(ops, key=lambda o: o["lin"]):
        k = op["key"]
        if op["f"] == "incr":
            if op["applies"]:
                counters[k] = counters.get(k, 0) + 1
                op["result"] = counters[k]
                idem_val[op["idem"]] = counters[k]
            continue
        val, ver = regs.get(k, (None, 0))
        if op["f"] == "read":
            op["result"] = (val, ver)
        elif op["f"] == "write":
            if op["applies"]:
                regs[k] = (op["value"], ver + 1)
        else:
            op["expect"] = ver if rng.random() < 0.6 else max(0, ver - rng.randrange(1, 3))
            if op["expect"] == ver:
                if op["applies"]:
                    regs[k] = (op["value"], ver + 1)
                op["cas_ok"] = True
            else:
                op["cas_ok"] = False
                if op["outcome"] == "ok":
                    op["outcome"] = "fail"
                    op["error"] = "compare_failed"
    events = []
    for op in ops:
        inv = {"type": "invoke", "client": op["client"], "f": op["f"], "key": op["key"],
               "time": op["call"]}
        for f in ("value", "expect", "idem"):
            if f in op and op[f] is not None:
                inv[f] = op[f]
        events.append(inv)
        done = dict(inv)
        done["type"] = op["outcome"]
        done["time"] = op["end"]
        if op["outcome"] == "ok":
            if op["f"] == "read":
                done["value"], done["version"] = op["result"]
            elif op["f"] == "incr":
                done["value"] = op["result"]
        elif op["outcome"] == "fail":
            done["error"] = op.get("error", "no_leader")
        else:
            done["error"] = "timeout"
        events.append(done)
    # a retry of some acknowledged increments, answered from the table
    t_end = max(o["end"] for o in ops) + 100
    for i, (idem, v) in enumerate(sorted(idem_val.items())[:3]):
        key = next(o["key"] for o in ops if o.get("idem") == idem)
        events.append({"type": "invoke", "client": 100 + i, "f": "incr", "key": key,
                       "idem": idem, "time": t_end + i * 10})
        events.append({"type": "ok", "client": 100 + i, "f": "incr", "key": key,
                       "idem": idem, "value": v, "replayed": True, "time": t_end + i * 10 + 5})
    # final reads
    t = t_end + 1000
    for k in sorted(set(o["key"] for o in ops if o["f"] != "incr")):
        val, ver = regs.get(k, (None, 0))
        events.append({"type": "invoke", "client": 999, "f": "read", "key": k,
                       "final": True, "time": t})
        events.append({"type": "ok", "client": 999, "f": "read", "key": k, "final": True,
                       "value": val, "version": ver, "time": t + 5})
        t += 10
    for k in sorted(set(o["key"] for o in ops if o["f"] == "incr")):
        events.append({"type": "invoke", "client": 999, "f": "read", "key": k,
                       "final": True, "counter": True, "time": t})
        events.append({"type": "ok", "client": 999, "f": "read", "key": k, "final": True,
                       "counter": True, "value": str(counters.get(k, 0)),
                       "version": counters.get(k, 0), "time": t + 5})
        t += 10
    events.sort(key=lambda e: (e["time"], e["type"] != "invoke"))
    # Per client, events must alternate: they do, since a client's ops do not
    # overlap; the stable sort keeps invoke before completion.
    return events


def plant(rng, events, kind):
    """Returns (a copy of `events` with one bug of `kind`, the violation it
    must cause as "KIND:KEY", the other kinds it may cause too), or None when
    the history offers no place for it. Reads during the run are planted in,
    not final reads (a changed final read is a lost or extra write too)."""
    ev = [dict(e) for e in events]
    if kind == "phantom-read":
        cands = [i for i, e in enumerate(ev) if e["type"] == "ok" and e["f"] == "read"
                 and not e.get("counter") and not e.get("final")]
        if not cands:
            return None
        i = rng.choice(cands)
        ev[i]["value"] = "nobody-wrote-this"
        ev[i]["version"] = max(1, ev[i]["version"])
        return ev, "linearizability:" + ev[i]["key"], ()
    if kind == "stale-read":
        # A read invoked after a write to its key completed, answering the
        # state from before that write.
        by_key_writes = {}
        for e in ev:
            if e["type"] == "ok" and e["f"] == "write":
                by_key_writes.setdefault(e["key"], []).append(e)
        for i, e in enumerate(ev):
            if e["type"] != "ok" or e["f"] != "read" or e.get("counter") or e.get("final"):
                continue
            if e["version"] < 1:
                continue
            inv_t = next(x["time"] for x in reversed(ev[:i]) if x["type"] == "invoke"
                         and x["client"] == e["client"])
            done = [w for w in by_key_writes.get(e["key"], []) if w["time"] < inv_t]
            if done:
                e["version"] = 0
                e["value"] = None
                return ev, "linearizability:" + e["key"], ()
        return None
    if kind == "lost-write":
        # The final read misses an acknowledged write: it answers one version
        # below the number of acknowledged writes and successful CASes.
        for e in ev:
            if e["type"] == "ok" and e.get("final") and not e.get("counter"):
                acked = sum(1 for x in ev if x["type"] == "ok" and x["key"] == e["key"]
                            and x["f"] in ("write", "cas"))
                if acked < 1:
                    continue
                e["version"] = acked - 1
                e["value"] = "older" if acked > 1 else None
                return ev, "acked-writes:" + e["key"], ("linearizability",)
        return None
    if kind == "double-incr":
        for e in ev:
            if e["type"] == "ok" and e.get("final") and e.get("counter"):
                e["value"] = str(int(e["value"]) + 1 + sum(
                    1 for x in ev if x["type"] == "info" and x["f"] == "incr"
                    and x["key"] == e["key"]))
                return ev, "idempotency:" + e["key"], ()
        return None
    raise ValueError(kind)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=60)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    failures = []

    def say(msg):
        if not a.quiet:
            print(msg)

    # 1. fixtures
    fx = os.path.join(HERE, "fixtures")
    for name in sorted(os.listdir(fx)):
        if not name.endswith(".jsonl"):
            continue
        base = name[:-6]
        with open(os.path.join(fx, name)) as f:
            res = checker.check(f)
        if base.startswith("good-"):
            if res["verdict"] != "PASS":
                failures.append("%s: expected PASS, got %s %s" % (name, res["verdict"],
                                                                  res["violations"]))
        else:
            want = EXPECT.get(base)
            why = wrong_violations(res, *want) if want else "no expectation in EXPECT"
            if why:
                failures.append("%s: %s" % (name, why))
        say("fixture %-32s %s" % (name, res["verdict"]))

    # 2 and 3. random histories, clean and with planted bugs
    planted = {"phantom-read": 0, "stale-read": 0, "lost-write": 0, "double-incr": 0}
    for seed in range(1, a.seeds + 1):
        rng = random.Random(seed)
        ev = gen_history(rng, n_clients=rng.randrange(2, 8), n_keys=rng.randrange(1, 4),
                         n_ops=rng.randrange(50, 400), p_info=rng.choice([0, 0.03, 0.1]))
        res = run_check(ev)
        if res["verdict"] != "PASS":
            failures.append("seed %d: a linearizable history got %s: %s %s" %
                            (seed, res["verdict"], res["violations"], res["inconclusive"]))
        for kind in planted:
            p = plant(rng, ev, kind)
            if p is None:
                continue
            bad, spec, allowed = p
            r2 = run_check(bad)
            planted[kind] += 1
            why = wrong_violations(r2, spec, allowed)
            if why:
                failures.append("seed %d: planted %s: %s" % (seed, kind, why))
    say("random histories: %d clean, planted %s" % (a.seeds, planted))
    for kind, n in planted.items():
        if n == 0:
            failures.append("planted %s never applied" % kind)

    # 4. a long cell: 30 s at ~150 ops/s over 10 keys, with unknown outcomes
    rng = random.Random(4242)
    ev = gen_history(rng, n_clients=10, n_keys=10, n_ops=5000, p_info=0.02)
    t0 = time.monotonic()
    res = run_check(ev)
    dt = time.monotonic() - t0
    say("long history: %d ops, %d info, %s in %.2f s (%d steps)" %
        (res["ops"], res["info"], res["verdict"], dt, res["search_steps"]))
    if res["verdict"] != "PASS":
        failures.append("long history: %s %s" % (res["verdict"], res["violations"]))

    for f in failures:
        print("SELFTEST FAILURE: " + f)
    print("selftest: %s" % ("FAIL" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
