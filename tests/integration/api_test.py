#!/usr/bin/env python3
"""Integration tests of the HTTP API v1 against three real tierkvd processes
on loopback (fs store): every endpoint through every node, Idempotency-Key,
pipelining, 64 concurrent connections, 30+ malformed or hostile requests
(each with its expected status, the server staying up and leaking no
connection), the connection limit, and a graceful SIGTERM.

usage: api_test.py path/to/tierkvd
"""
import base64
import json
import os
import socket
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import (Cluster, Fail, Node, check, check_graceful_stop, finish,  # noqa: E402
                       free_ports, jreq, parse_responses, raw, request, run, status_of)

# Writes through a follower: the node forwards them to the leader over the
# Raft transport, so a follower answers 200 like the leader. A 503 not_leader
# (the leader changed while forwarding) is accepted, with its hint checked,
# only when TIERKV_IT_REQUIRE_FORWARDING=0.
REQUIRE_FORWARDING = os.environ.get("TIERKV_IT_REQUIRE_FORWARDING", "1") != "0"

C = None
LEADER = None

OPERATIONS_MD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                             "operations.md")


def documented_metrics():
    """The metric families the table of docs/operations.md ("Metrics") lists."""
    names = set()
    with open(OPERATIONS_MD, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("| `tierkv_"):
                continue
            first = line.split("|")[1]
            for word in first.split("`")[1::2]:
                names.add(word.split("{")[0])
    return names


DOCUMENTED_METRICS = documented_metrics()


def families(text):
    """The metric families a /metrics body declares (# TYPE lines)."""
    return {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")}


def write(nd, method, path, obj=None, body=None, headers=None):
    """A write through node `nd`; follows a not_leader answer to the hinted
    leader (checking the hint) unless forwarding is required."""
    port = nd.http_port
    if obj is not None:
        st, hd, js = jreq(port, method, path, obj, headers)
    else:
        st, hd, data = request(port, method, path, body, headers)
        js = json.loads(data) if data else None
    if st == 503 and js and js["error"]["code"] == "not_leader" and not REQUIRE_FORWARDING:
        check("retry-after" in hd, "503 not_leader without Retry-After")
        check(int(hd.get("x-tierkv-leader", 0)) == LEADER,
              "leader hint %r, leader is %d" % (hd.get("x-tierkv-leader"), LEADER))
        addr = hd.get("x-tierkv-leader-addr", "")
        check(addr == "127.0.0.1:%d" % C.node(LEADER).http_port, "leader addr %r" % addr)
        return write(C.node(LEADER), method, path, obj, body, headers)
    return st, hd, js


def expect(got, status, what):
    check(got[0] == status, "%s: status %d (want %d) body %r" % (what, got[0], status, got[2]))
    return got


def test_every_endpoint_through_every_node():
    for nd in C.nodes:
        k = "ep/%d/" % nd.id
        q = urllib.parse.quote
        # put raw, get json, get raw, get base64, stale get
        st, hd, js = expect(write(nd, "PUT", "/v1/kv/" + q(k + "a"), body=b"hello"), 200, "put")
        rev = js["revision"]
        check(int(hd["x-tierkv-revision"]) == rev, "X-Tierkv-Revision")
        check(int(hd["x-tierkv-leader"]) == LEADER, "X-Tierkv-Leader on a write")
        for rd in C.nodes:
            st, hd, js = expect(jreq(rd.http_port, "GET", "/v1/kv/" + q(k + "a")), 200, "get")
            check(js["value"] == "hello" and js["key"] == k + "a", "get body %r" % js)
            check(js["mod_revision"] == rev and js["version"] == 1, "get revisions %r" % js)
            check(int(hd["x-tierkv-leader"]) == LEADER, "X-Tierkv-Leader on a read")
            st, _, data = request(rd.http_port, "GET", "/v1/kv/" + q(k + "a") + "?raw")
            check(st == 200 and data == b"hello", "raw get %d %r" % (st, data))
            st, _, js = jreq(rd.http_port, "GET", "/v1/kv/" + q(k + "a") + "?encoding=base64")
            check(st == 200 and base64.b64decode(js["value"]) == b"hello"
                  and js["encoding"] == "base64", "b64 get %r" % js)
            st, _, js = jreq(rd.http_port, "GET",
                             "/v1/kv/" + q(k + "a") + "?consistency=stale")
            check(st in (200, 404), "stale get %d" % st)
        # JSON put with compare, ttl; committed mode
        expect(write(nd, "PUT", "/v1/kv/" + q(k + "a"), {"value": "v2", "if_version": 1}), 200,
               "cas put")
        st, _, js = expect(write(nd, "PUT", "/v1/kv/" + q(k + "a"),
                                 {"value": "v3", "if_version": 1}), 409, "failed cas")
        check(js["error"]["code"] == "compare_failed", "409 code")
        expect(write(nd, "PUT", "/v1/kv/" + q(k + "b") + "?mode=committed", body=b"x"), 200,
               "committed put")
        expect(write(nd, "PUT", "/v1/kv/" + q(k + "ttl"), {"value": "t", "ttl_ms": 60000}), 200,
               "ttl put")
        expect(write(nd, "PUT", "/v1/kv/" + q(k + "new") + "?if_absent", body=b"1"), 200,
               "if_absent put")
        expect(write(nd, "PUT", "/v1/kv/" + q(k + "new") + "?if_absent", body=b"1"), 409,
               "if_absent put again")
        # binary value: base64 with an encoding marker
        expect(write(nd, "PUT", "/v1/kv/" + q(k + "bin"), body=b"\xff\x00\xfe"), 200, "bin put")
        st, _, js = expect(jreq(nd.http_port, "GET", "/v1/kv/" + q(k + "bin")), 200, "bin get")
        check(js.get("encoding") == "base64" and base64.b64decode(js["value"]) == b"\xff\x00\xfe",
              "binary value %r" % js)
        # incr
        st, _, js = expect(write(nd, "POST", "/v1/kv/" + q(k + "n") + "/incr?delta=5"), 200,
                           "incr")
        check(js["value"] == 5, "incr value %r" % js)
        st, _, js = expect(write(nd, "POST", "/v1/kv/" + q(k + "n") + "/incr", {"delta": -2}),
                           200, "incr json")
        check(js["value"] == 3, "incr value %r" % js)
        # batch and txn
        st, _, js = expect(write(nd, "POST", "/v1/batch", {"ops": [
            {"op": "put", "key": k + "c1", "value": "1"},
            {"op": "put", "key": k + "c2", "value": "2"},
            {"op": "delete", "key": k + "b"}]}), 200, "batch")
        check(js["results"][2] == {"op": "delete", "deleted": 1}, "batch results %r" % js)
        txn = {"compare": [{"key": k + "c1", "target": "value", "value": "1"}],
               "then": [{"op": "incr", "key": k + "n", "delta": 10}],
               "else": [{"op": "delete", "key": k + "n"}]}
        st, _, js = expect(write(nd, "POST", "/v1/txn", txn), 200, "txn")
        check(js["succeeded"] is True and js["results"][0]["value"] == 13, "txn %r" % js)
        txn["compare"][0]["value"] = "nope"
        st, _, js = expect(write(nd, "POST", "/v1/txn", txn), 200, "txn else")
        check(js["succeeded"] is False and js["results"][0]["deleted"] == 1, "txn else %r" % js)
        # scans through every node
        for rd in C.nodes:
            st, _, js = expect(jreq(rd.http_port, "GET", "/v1/kv?prefix=" + q(k)), 200, "scan")
            keys = [it["key"] for it in js["items"]]
            check(keys == sorted(keys) and k + "c1" in keys and k + "n" not in keys,
                  "scan keys %r" % keys)
            st, _, js = expect(jreq(rd.http_port, "GET", "/v1/kv?start=%s&end=%s&limit=1"
                                    % (q(k + "c"), q(k + "d"))), 200, "range scan")
            check(js["count"] == 1 and js["more"] is True and js["items"][0]["key"] == k + "c1",
                  "range scan %r" % js)
        # deletes
        st, _, js = expect(write(nd, "DELETE", "/v1/kv/" + q(k + "a")), 200, "delete")
        check(js["deleted"] == 1, "deleted %r" % js)
        expect(jreq(nd.http_port, "GET", "/v1/kv/" + q(k + "a")), 404, "get deleted")
        st, _, js = expect(write(nd, "DELETE", "/v1/kv?prefix=" + q(k + "c")), 200, "del range")
        check(js["deleted"] == 2, "delete range %r" % js)
        # status endpoints
        st, hd, js = expect(jreq(nd.http_port, "GET", "/v1/cluster"), 200, "cluster")
        check(js["id"] == nd.id and js["leader"] == LEADER and len(js["members"]) == 3,
              "cluster %r" % js)
        check(js["applied"] <= js["commit"] <= js["last_index"] or js["applied"] >= 1,
              "indexes %r" % js)
        expect(jreq(nd.http_port, "GET", "/healthz"), 200, "healthz")
        expect(jreq(nd.http_port, "GET", "/readyz"), 200, "readyz")
        st, hd, data = request(nd.http_port, "GET", "/metrics")
        check(st == 200 and hd["content-type"].startswith("text/plain"), "metrics")
        text = data.decode()
        for m in ("tierkv_raft_term ", "tierkv_raft_commit_index ", "tierkv_raft_applied_index ",
                  "tierkv_http_requests_total{route=\"kv_get\",code=\"200\"}",
                  "tierkv_http_request_duration_seconds_count", "tierkv_transport_sent_bytes_total",
                  "tierkv_read_index_total", "tierkv_read_index_rounds_total ",
                  "tierkv_store_appended_bytes_total ", "tierkv_kv_ring_bytes ",
                  "tierkv_kv_hot_keys ", "tierkv_kv_cold_keys ", "tierkv_kv_cold_bytes ",
                  "tierkv_store_log_bytes ",
                  "# TYPE tierkv_store_append_seconds histogram",
                  "# TYPE tierkv_store_fsync_seconds histogram",
                  "# TYPE tierkv_apply_seconds histogram",
                  "tierkv_store_fsync_seconds_bucket{le=\"+Inf\"} ",
                  "tierkv_apply_seconds_bucket{le=\"0.001\"} "):
            check(m in text, "metric %s missing" % m)
        check(DOCUMENTED_METRICS <= families(text), "documented but not exported: %s"
              % sorted(DOCUMENTED_METRICS - families(text)))
        check(families(text) <= DOCUMENTED_METRICS, "exported but not documented: %s"
              % sorted(families(text) - DOCUMENTED_METRICS))
    # The leader confirms linearizable reads in ReadIndex rounds, from every node.
    st, _, data = request(C.node(LEADER).http_port, "GET", "/metrics")
    rounds = [ln for ln in data.decode().splitlines()
              if ln.startswith("tierkv_read_index_rounds_total ")]
    check(rounds and int(rounds[0].split()[1]) >= 1, "leader's rounds: %r" % rounds)


def test_idempotency_key_applies_once():
    nd = C.node(LEADER)
    h = {"Idempotency-Key": "it-incr-%d" % time.time_ns()}
    st, _, a = expect(write(nd, "POST", "/v1/kv/idem/incr", headers=h), 200, "first")
    st, _, b = expect(write(nd, "POST", "/v1/kv/idem/incr", headers=h), 200, "retry")
    check(a["value"] == 1 and b["value"] == 1 and b.get("replayed") is True
          and a["revision"] == b["revision"], "retry applied twice: %r %r" % (a, b))
    # through another node too (a follower relays the same answer)
    other = C.nodes[LEADER % 3]
    st, _, c = expect(write(other, "POST", "/v1/kv/idem/incr", headers=h), 200, "retry 2")
    check(c["value"] == 1, "retry through another node applied: %r" % c)
    check(c.get("replayed") is True and c["revision"] == a["revision"],
          "a retry through a follower lost replayed (issue 19): %r" % c)
    # a delete range with a key, retried through a follower: replayed, same count
    hd = {"Idempotency-Key": "it-dr-%d" % time.time_ns()}
    for i in range(3):
        expect(write(nd, "PUT", "/v1/kv/idem-dr/%d" % i, body="v"), 200, "put dr")
    st, _, e = expect(write(nd, "DELETE", "/v1/kv?prefix=idem-dr/", headers=hd), 200, "dr")
    st, _, f = expect(write(other, "DELETE", "/v1/kv?prefix=idem-dr/", headers=hd), 200, "dr 2")
    check(e["deleted"] == 3 and "replayed" not in e and f.get("replayed") is True
          and f["deleted"] == 3, "delete range retried: %r %r" % (e, f))
    st, _, d = expect(write(nd, "POST", "/v1/kv/idem/incr"), 200, "no key")
    check(d["value"] == 2, "a write without the key applies: %r" % d)


def test_pipelined_responses_in_request_order():
    port = C.node(LEADER).http_port
    reqs = b""
    n = 40
    for i in range(n):
        if i % 2 == 0:
            body = b"v%d" % i
            reqs += b"PUT /v1/kv/pipe/%d HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
                i, len(body), body)
        else:
            reqs += b"GET /v1/kv/pipe/%d HTTP/1.1\r\nHost: x\r\n\r\n" % (i - 1)
    reqs += b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    out = raw(port, reqs, timeout=10, until_close=True)
    codes = status_of(out)
    check(codes == [200] * (n + 1), "pipelined statuses %r" % codes)
    # each GET answer follows its PUT: the value must be there, in order
    vals = [json.loads(body)["value"] for st, hd, body in parse_responses(out)
            if body.startswith(b"{\"key\"")]
    check(vals == ["v%d" % i for i in range(0, n, 2)], "pipelined GETs %r" % vals[:5])


def test_64_concurrent_connections():
    import http.client
    errors = []
    leader_port = C.node(LEADER).http_port

    def worker(w):
        try:
            c = http.client.HTTPConnection("127.0.0.1", leader_port, timeout=20)
            rc = http.client.HTTPConnection("127.0.0.1", C.nodes[w % 3].http_port, timeout=20)
            for i in range(15):
                c.request("PUT", "/v1/kv/conc/%d/%d" % (w, i), body=b"x" * 64)
                r = c.getresponse()
                r.read()
                if r.status != 200:
                    errors.append("put %d" % r.status)
                rc.request("GET", "/v1/kv/conc/%d/%d?consistency=stale" % (w, i))
                r = rc.getresponse()
                r.read()
                if r.status not in (200, 404):
                    errors.append("get %d" % r.status)
            c.close()
            rc.close()
        except Exception as e:
            errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(64)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    check(not errors, "%d errors, first %r" % (len(errors), errors[:3]))
    st, _, js = jreq(leader_port, "GET", "/v1/kv?prefix=conc/&limit=10000")
    check(st == 200 and js["count"] == 64 * 15, "scan after concurrency: %r" % js.get("count"))


def mk(method, path, body=b"", headers=b""):
    """A raw request with a correct Content-Length."""
    return b"%s %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (
        method, path, headers, len(body), body)


JSON_CT = b"Content-Type: application/json\r\n"


def hostile_cases(port):
    big = b"x" * (1024 * 1024 + 1)
    ops = [{"op": "put", "key": "k%d" % i, "value": "v"} for i in range(129)]
    cases = [
        # (name, raw request bytes, expected status)
        ("bad json", b"PUT /v1/kv/h HTTP/1.1\r\nContent-Type: application/json\r\n"
         b"Content-Length: 9\r\n\r\n{\"value\":", 400),
        ("json not object", b"PUT /v1/kv/h HTTP/1.1\r\nContent-Type: application/json\r\n"
         b"Content-Length: 3\r\n\r\n[1]", 400),
        ("json unknown field", mk(b"PUT", b"/v1/kv/h", b'{"value":"a","bogus":11}', JSON_CT),
         400),
        ("json bad utf-8", b"PUT /v1/kv/h HTTP/1.1\r\nContent-Type: application/json\r\n"
         b"Content-Length: 14\r\n\r\n{\"value\":\"\xff\xfe\"}", 400),
        ("json value not string", b"PUT /v1/kv/h HTTP/1.1\r\nContent-Type: application/json\r\n"
         b"Content-Length: 11\r\n\r\n{\"value\":1}", 400),
        ("json duplicate keys", b"PUT /v1/kv/h HTTP/1.1\r\nContent-Type: application/json\r\n"
         b"Content-Length: 25\r\n\r\n{\"value\":\"a\",\"value\":\"b\"}", 400),
        ("batch bad json", b"POST /v1/batch HTTP/1.1\r\nContent-Length: 5\r\n\r\n{ops:", 400),
        ("batch empty body", b"POST /v1/batch HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400),
        ("batch too many ops", b"POST /v1/batch HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (
            len(json.dumps({"ops": ops})), json.dumps({"ops": ops}).encode()), 413),
        ("batch incr", mk(b"POST", b"/v1/batch", b'{"ops":[{"op":"incr","key":"k"}]}'), 400),
        ("txn bad target", mk(b"POST", b"/v1/txn",
                              b'{"compare":[{"key":"k","target":"colour"}]}'), 400),
        ("txn op not object", mk(b"POST", b"/v1/txn", b'{"then":[17]}'), 400),
        ("bad base64", b"PUT /v1/kv/h?encoding=base64 HTTP/1.1\r\nContent-Type: "
         b"application/json\r\nContent-Length: 15\r\n\r\n{\"value\":\"!!!\"}", 400),
        ("huge header", b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 431),
        ("many headers", b"GET /healthz HTTP/1.1\r\n" + b"".join(
            b"X-H%d: %s\r\n" % (i, b"b" * 100) for i in range(300)) + b"\r\n", 431),
        ("huge url", b"GET /v1/kv/" + b"u" * 20000 + b" HTTP/1.1\r\n\r\n", 414),
        ("declared body too large", b"PUT /v1/kv/h HTTP/1.1\r\nContent-Length: 5000000\r\n\r\n",
         413),
        ("value too large", b"PUT /v1/kv/h HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (
            len(big), big), 413),
        ("key too large", b"GET /v1/kv/" + b"k" * 5000 + b" HTTP/1.1\r\n\r\n", 413),
        ("chunked too large", b"PUT /v1/kv/h HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"500000\r\n" + b"z" * 100000, 413),
        ("length and chunked", b"PUT /v1/kv/h HTTP/1.1\r\nContent-Length: 3\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 400),
        ("two lengths", b"PUT /v1/kv/h HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"
         b"abcd", 400),
        ("bad length", b"PUT /v1/kv/h HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400),
        ("unknown transfer coding", b"PUT /v1/kv/h HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
         400),
        ("garbage request line", b"HELLO THERE\r\n\r\n", 400),
        ("unknown method", b"BREW /v1/kv/h HTTP/1.1\r\n\r\n", 400),
        ("header without colon", b"GET /healthz HTTP/1.1\r\nNoColonHere\r\n\r\n", 400),
        ("nul in path", b"GET /v1/kv/a\x00b HTTP/1.1\r\n\r\n", 400),
        ("http/2 line", b"GET /healthz HTTP/2.0\r\n\r\n", 505),
        ("patch", b"PATCH /v1/kv/h HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        ("post on key", b"POST /v1/kv/h HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        ("get batch", b"GET /v1/batch HTTP/1.1\r\n\r\n", 405),
        ("unknown route", b"GET /v2/kv/h HTTP/1.1\r\n\r\n", 404),
        ("near route", b"GET /v1/kvx HTTP/1.1\r\n\r\n", 404),
        ("unknown query param", b"GET /v1/kv/h?colour=red HTTP/1.1\r\n\r\n", 400),
        ("bad escape in key", b"GET /v1/kv/%zz HTTP/1.1\r\n\r\n", 400),
        ("empty key", b"POST /v1/kv//incr HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400),
        ("bad mode", b"PUT /v1/kv/h?mode=eventually HTTP/1.1\r\nContent-Length: 1\r\n\r\nx", 400),
        ("bad consistency", b"GET /v1/kv/h?consistency=maybe HTTP/1.1\r\n\r\n", 400),
        ("bad limit", b"GET /v1/kv?limit=abc HTTP/1.1\r\n\r\n", 400),
        ("zero limit", b"GET /v1/kv?limit=0 HTTP/1.1\r\n\r\n", 400),
        ("prefix and end", b"GET /v1/kv?prefix=a&end=b HTTP/1.1\r\n\r\n", 400),
        ("body on get", b"GET /v1/kv/h HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi", 400),
        ("bad delta", b"POST /v1/kv/h/incr?delta=1.5 HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400),
        ("delete all without prefix", b"DELETE /v1/kv HTTP/1.1\r\n\r\n", 400),
        ("two idempotency keys", b"PUT /v1/kv/h HTTP/1.1\r\nIdempotency-Key: a\r\n"
         b"Idempotency-Key: b\r\nContent-Length: 1\r\n\r\nx", 400),
        ("missing key", b"GET /v1/kv/never-written-key HTTP/1.1\r\n\r\n", 404),
    ]
    return cases


def metric(port, name):
    st, _, data = request(port, "GET", "/metrics")
    for line in data.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise Fail("metric %s missing" % name)


def test_hostile_requests_get_expected_status():
    port = C.node(LEADER).http_port
    # incr on a non-integer value is a 409
    expect(request(port, "PUT", "/v1/kv/notnum", b"abc"), 200, "put notnum")
    cases = hostile_cases(port) + [
        ("incr non-integer", b"POST /v1/kv/notnum/incr HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 409)]
    check(len(cases) >= 30, "only %d cases" % len(cases))
    bad = []
    for name, data, want in cases:
        out = raw(port, data, timeout=5)
        codes = status_of(out)
        if not codes or codes[0] != want:
            bad.append("%s: got %r want %d (%r)" % (name, codes, want, out[:200]))
        rs = parse_responses(out)
        body = rs[0][2] if rs else b""
        if codes and codes[0] >= 400:
            try:
                err = json.loads(body)["error"]
                if not (err["code"] and err["message"]):
                    bad.append("%s: empty error fields" % name)
            except Exception:
                bad.append("%s: error body not JSON: %r" % (name, body[:100]))
        st, _, _ = request(port, "GET", "/healthz")
        check(st == 200, "server down after %s" % name)
    check(not bad, "%d/%d cases wrong:\n  %s" % (len(bad), len(cases), "\n  ".join(bad)))


def test_a_batch_too_large_for_an_entry_is_refused_before_parsing():
    """Four values of 1,047,600 bytes: the body is under the 4 MiB body limit,
    but the keys and values alone pass the largest raft entry (4 MiB - 4 KiB):
    413 from the prescan, naming the entry limit, and nothing is written; the
    same batch with three values is a write."""
    port = C.node(LEADER).http_port
    val = "b" * 1047600

    def body(n):
        ops = ",".join('{"op":"put","key":"big%d","value":"%s"}' % (i, val) for i in range(n))
        return ('{"ops":[%s]}' % ops).encode()

    b4 = body(4)
    check(len(b4) <= 4 << 20, "the body is %d bytes, over the body limit" % len(b4))
    t0 = time.time()
    st, _, out = request(port, "POST", "/v1/batch", b4, timeout=30)
    dt = time.time() - t0
    check(st == 413 and b"largest raft entry" in out and b"keys and values alone" in out,
          "4 values: %s %r" % (st, out[:300]))
    st, _, _ = request(port, "GET", "/v1/kv/big0")
    check(st == 404, "a refused batch wrote big0: %s" % st)
    st, _, out = request(port, "POST", "/v1/batch", body(3), timeout=30)
    check(st == 200, "3 values: %s %r" % (st, out[:300]))
    print("    refused in %.1f ms (client round trip)" % (dt * 1e3), flush=True)


def test_mutated_requests_never_break_the_server():
    """300 valid requests with random byte flips, insertions and cuts (seeded:
    TIERKV_IT_SEED replays a run): every answer is a well-formed HTTP response
    with an expected status (never 500), or a close; the server stays up."""
    import random
    seed = int(os.environ.get("TIERKV_IT_SEED", "12345"))
    rnd = random.Random(seed)
    port = C.node(LEADER).http_port
    base = [
        mk(b"PUT", b"/v1/kv/mut", b"value"),
        mk(b"PUT", b"/v1/kv/mut?ttl_ms=5000", b'{"value":"v","if_version":0}', JSON_CT),
        b"GET /v1/kv/mut?encoding=base64 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/kv?prefix=mu&limit=3 HTTP/1.1\r\n\r\n",
        mk(b"POST", b"/v1/batch", b'{"ops":[{"op":"put","key":"m1","value":"1"}]}'),
        mk(b"POST", b"/v1/txn", b'{"compare":[{"key":"m1","target":"exists"}],"then":[]}'),
        mk(b"POST", b"/v1/kv/mutn/incr", b'{"delta":2}'),
        b"DELETE /v1/kv/m1 HTTP/1.1\r\n\r\n",
        b"PUT /v1/kv/chunk HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    ]
    allowed = {200, 400, 404, 405, 408, 409, 413, 414, 431, 503, 505}
    jobs = []
    for i in range(300):
        b = bytearray(rnd.choice(base))
        for _ in range(rnd.randint(1, 4)):
            if not b:
                break
            k = rnd.randrange(4)
            pos = rnd.randrange(len(b))
            if k == 0:
                b[pos] = rnd.randrange(256)
            elif k == 1:
                b[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
            elif k == 2:
                del b[pos:pos + rnd.randint(1, 8)]
            else:
                b = b[:pos]
        jobs.append(bytes(b))
    bad = []

    def worker(items):
        for data in items:
            out = raw(port, data, timeout=3)
            for st in status_of(out):
                if st not in allowed:
                    bad.append((st, data[:80], out[:200]))
            if out and not out.startswith(b"HTTP/1.1 "):
                bad.append(("garbage", data[:80], out[:80]))

    ts = [threading.Thread(target=worker, args=(jobs[w::16],)) for w in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    check(not bad, "seed %d: %d bad answers, first %r" % (seed, len(bad), bad[:2]))
    check(request(port, "GET", "/healthz")[0] == 200, "server down after mutations")


def test_slow_clients_are_cut_off():
    port = C.node(LEADER).http_port
    # headers never finish (header timeout 1 s)
    t0 = time.time()
    out = raw(port, b"GET /healthz HTTP/1.1\r\nX-Slow: ", timeout=6)
    check(status_of(out) == [408], "slow headers: %r" % out[:100])
    check(time.time() - t0 < 4, "slow headers cut after %.1fs" % (time.time() - t0))
    # body never finishes (body timeout 1 s)
    out = raw(port, b"PUT /v1/kv/slow HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly-a-bit", timeout=6)
    check(status_of(out) == [408], "slow body: %r" % out[:100])
    # a byte at a time still hits the header deadline
    s = socket.create_connection(("127.0.0.1", port), timeout=6)
    t0 = time.time()
    got = b""
    try:
        for ch in b"GET /healthz HTTP/1.1\r\nX-Drip: abcdefghijklmnopqrstuvwxyz":
            s.sendall(bytes([ch]))
            time.sleep(0.1)
            if time.time() - t0 > 5:
                break
    except OSError:
        pass
    try:
        got = s.recv(4096)
    except OSError:
        pass
    s.close()
    check(status_of(got) == [408], "drip-fed headers: %r" % got[:100])
    # an idle keep-alive connection is closed (idle timeout 2 s)
    out = raw(port, b"", timeout=6, until_close=True)
    check(out == b"", "idle connection got %r" % out[:50])


def test_no_connection_leak():
    port = C.node(LEADER).http_port
    deadline = time.time() + 5
    while time.time() < deadline:
        n = metric(port, "tierkv_http_connections")
        if n <= 1:  # the /metrics request itself
            return
        time.sleep(0.1)
    raise Fail("tierkv_http_connections stays at %d" % n)


def test_connection_limit_and_sigterm():
    """A separate single node with --max-connections 4."""
    binary = C.binary
    port, = free_ports(1)
    nd = Node(binary, 9, ["--id", "9", "--store", "mem", "--listen-http",
                          "127.0.0.1:%d" % port, "--max-connections", "4"], C.dir)
    nd.http_port = port
    nd.start()
    deadline = time.time() + 10
    while True:
        try:
            if request(port, "GET", "/healthz")[0] == 200:
                break
        except OSError:
            pass
        check(time.time() < deadline, "single node did not start: %s" % nd.log())
        time.sleep(0.05)
    # Four connections busy receiving a request: the fifth is refused.
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    for s in held:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
    time.sleep(0.2)
    out = raw(port, b"GET /healthz HTTP/1.1\r\n\r\n", timeout=5)
    check(status_of(out) == [503] and b"too_many_connections" in out and b"Retry-After" in out,
          "fifth connection: %r" % out[:200])
    for s in held:
        s.close()
    time.sleep(0.2)
    check(request(port, "GET", "/healthz")[0] == 200, "after closing the held connections")
    # Four idle keep-alive connections (issue 19): the oldest gives way.
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    time.sleep(0.2)
    out = raw(port, b"GET /healthz HTTP/1.1\r\n\r\n", timeout=5)
    check(status_of(out) == [200], "fifth connection beside idle ones: %r" % out[:200])
    for s in held:
        s.close()
    time.sleep(0.2)
    # SIGTERM with an open keep-alive connection: a clean exit 0
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
    s.recv(4096)
    code = nd.term()
    s.close()
    check(code == 0, "exit code after SIGTERM %r\n%s" % (code, nd.log()))
    check("stopped" in nd.log(), "no 'stopped' line in the log")


def test_graceful_stop_of_cluster():
    check_graceful_stop(C)


def main():
    global C, LEADER
    binary = sys.argv[1]
    C = Cluster(binary, 3, ["--header-timeout-ms", "1000", "--body-timeout-ms", "1000",
                            "--idle-timeout-ms", "2000", "--max-connections", "300"])
    C.start()
    LEADER = C.wait_leader()
    print("leader: node %d (data in %s)" % (LEADER, C.dir), flush=True)
    failed = run([test_every_endpoint_through_every_node,
                  test_idempotency_key_applies_once,
                  test_pipelined_responses_in_request_order,
                  test_64_concurrent_connections,
                  test_hostile_requests_get_expected_status,
                  test_a_batch_too_large_for_an_entry_is_refused_before_parsing,
                  test_mutated_requests_never_break_the_server,
                  test_slow_clients_are_cut_off,
                  test_no_connection_leak,
                  test_connection_limit_and_sigterm,
                  test_graceful_stop_of_cluster])
    finish(C, failed)


if __name__ == "__main__":
    main()
