#!/usr/bin/env python3
"""Scans answer in bounded pages, and leave out the node's own records.

One tierkvd (fs store). A scan's answer is at most a quarter of the body
limit of JSON (plus one item when a single item is larger): a range of
12 MiB of values comes back in pages that each say more/next, never as a
503 built and thrown away, and paging with start=next reads every key once.
Plain scans leave out the keys whose first byte is 0x01 (membership and lease
records); ?internal=true shows them. Paging walks over the hole they leave.

usage: scan_page_test.py path/to/tierkvd
"""
import json
import os
import sys
import threading
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import Cluster, check, finish, jreq, request, run  # noqa: E402

C = None
BODY_MAX = 1 << 20  # --max-body-bytes: pages of 256 KiB
PAGE = BODY_MAX // 4
VALUE = 60 * 1024
KEYS = 200  # 200 x 60 KiB = 12 MiB


def port():
    return C.node(1).http_port


def q(s):
    return urllib.parse.quote(s, safe="")


def scan(params):
    st, hdrs, body = request(port(), "GET", "/v1/kv/?" + params, timeout=30)
    return st, body


def load():
    for i in range(KEYS):
        val = chr(ord("a") + i % 26) * VALUE
        st, _, js = jreq(port(), "PUT", "/v1/kv/big/%04d" % i, {"value": val})
        check(st == 200, "put %d: %s %s" % (i, st, js))


def test_a_big_range_comes_back_in_bounded_pages():
    load()
    seen, pages, start, biggest = [], 0, None, 0
    while True:
        params = "prefix=big/&limit=10000" + ("&start=" + q(start) if start else "")
        st, body = scan(params)
        check(st == 200, "page %d: %s %s" % (pages, st, body[:200]))
        biggest = max(biggest, len(body))
        check(len(body) <= PAGE + VALUE + 4096,
              "page %d is %d bytes (page bound %d)" % (pages, len(body), PAGE))
        js = json.loads(body)
        seen += [it["key"] for it in js["items"]]
        pages += 1
        check(js["count"] == len(js["items"]) and js["count"] > 0, "count %r" % js["count"])
        if not js["more"]:
            check("next" not in js, "next without more")
            break
        start = js["next"]
        check(pages < 2 * KEYS, "paging does not end")
    want = ["big/%04d" % i for i in range(KEYS)]
    check(seen == want, "paged keys differ: %d seen (%d distinct), first %r, last %r" % (
        len(seen), len(set(seen)), seen[:3], seen[-3:]))
    print("    %d keys of %d KiB in %d pages, the largest %d bytes (bound %d)"
          % (KEYS, VALUE // 1024, pages, biggest, PAGE), flush=True)
    check(pages >= 12 * (1 << 20) // PAGE // 2, "only %d pages" % pages)


def test_concurrent_big_scans_get_a_page_or_a_503_up_front():
    """20 readers at once of the 12 MiB range: each gets a page or a small
    503 overloaded (the turn's budget, asked before building), never a
    connection reset; the node still answers a small read at once after."""
    results = []

    def reader():
        try:
            st, body = scan("prefix=big/&limit=10000")
            results.append((st, len(body)))
        except Exception as e:  # noqa: BLE001
            results.append((repr(e), 0))

    ts = [threading.Thread(target=reader) for _ in range(20)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    codes = sorted({r[0] for r in results}, key=str)
    print("    20 readers: statuses %s, %d pages" % (codes, sum(1 for r in results if r[0] == 200)),
          flush=True)
    check(len(results) == 20 and all(r[0] in (200, 503) for r in results), "results %r" % results)
    check(all(r[1] < 4096 for r in results if r[0] == 503), "a 503 carried a body: %r" % results)
    st, _, js = jreq(port(), "GET", "/v1/kv/big/0001")
    check(st == 200, "small read after: %s" % st)


def test_internal_records_are_left_out_unless_asked():
    for k in ("\x00low", "\x02high", "zz"):
        st, _, js = jreq(port(), "PUT", "/v1/kv/" + q(k), {"value": "v"})
        check(st == 200, "put %r: %s %s" % (k, st, js))
    # Everything before the big range, then the rest after it.
    st, body = scan("limit=10000&encoding=base64&end=big/")
    check(st == 200, "scan: %s" % st)
    import base64
    keys = [base64.b64decode(it["key"]) for it in json.loads(body)["items"]]
    st, body = scan("limit=10000&encoding=base64&start=big0")
    keys += [base64.b64decode(it["key"]) for it in json.loads(body)["items"]]
    check(not any(k[:1] == b"\x01" for k in keys), "internal keys in a plain scan: %r"
          % [k for k in keys if k[:1] == b"\x01"])
    check(keys == [b"\x00low", b"\x02high", b"zz"], "user keys: %r" % keys)
    st, body = scan("limit=10000&encoding=base64&internal=true")
    check(st == 200, "scan internal: %s" % st)
    keys = [base64.b64decode(it["key"]) for it in json.loads(body)["items"]]
    check(any(k.startswith(b"\x01tierkv/member/") for k in keys),
          "?internal=true shows no member record")
    # A prefix inside the reserved range is empty unless asked.
    st, body = scan("prefix=" + q("\x01tierkv/member/"))
    check(st == 200 and json.loads(body)["count"] == 0, "reserved prefix: %s %s" % (st, body[:200]))
    # Paging one key at a time walks over the hole.
    st, body = scan("limit=1&encoding=base64")
    js = json.loads(body)
    check(base64.b64decode(js["items"][0]["key"]) == b"\x00low", "first page %r" % js)
    check(base64.b64decode(js["next"]) == b"\x02high", "next after the hole: %r" % js)
    st, body = scan("internal=maybe")
    check(st == 400, "a bad flag: %s" % st)


def main():
    global C
    C = Cluster(sys.argv[1], 1, extra_args=["--max-body-bytes", str(BODY_MAX)])
    C.start()
    C.wait_leader()
    failed = run([test_a_big_range_comes_back_in_bounded_pages,
                  test_concurrent_big_scans_get_a_page_or_a_503_up_front,
                  test_internal_records_are_left_out_unless_asked])
    finish(C, failed)


if __name__ == "__main__":
    main()
