#!/usr/bin/env python3
"""The status page (GET /ui) in a real browser: headless Chromium against a
real three-node tierkvd cluster.

1. /ui answers 200 text/html with Access-Control-Allow-Origin: * and this
   node's status spliced in (the tk-node script element).
2. Chromium loads /ui from a follower (--dump-dom with a virtual-time budget,
   so the page's one-second polls run): the DOM shows three members, exactly
   one of them leader, the leader card naming the leader the nodes agree on,
   and no JavaScript error (the page's error handlers mark the body).
3. After 30 writes, a second load shows a commit index that moved.
4. A screenshot goes to SCREENSHOT_DIR/ui.png (for a person to look at).
5. Failover: the page stays open in Chromium driven over DevTools
   (--remote-debugging-pipe); once it shows three members up, the leader is
   killed, and the test reads the leader card every 50 ms: the new leader
   must show within 10 s of the kill (the test prints how fast), with no
   JavaScript exception.
6. The page outlives its node: loaded from the leader, which is then killed,
   it must show within 10 s (read every 50 ms) its node down ("down (last
   answered N s ago)", its row unreachable, 2 / 3 up) and the leader the
   other members elected, asked directly (their /ui).

Exit 77 (skip) when no Chromium is installed, except under CI=true, where
that fails. Every wait is a bounded poll.

usage: ui_browser_test.py TIERKVD SCREENSHOT_DIR
"""
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tkcluster  # noqa: E402
from tkcluster import Fail, check  # noqa: E402


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def chrome(browser, profile, args, url, timeout=120):
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-extensions", "--user-data-dir=" + profile] + args + [url]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return r.stdout.decode(errors="replace")


class DevTools:
    """Chromium driven over --remote-debugging-pipe (fd 3: commands in, fd 4:
    replies and events out, JSON messages ending in NUL)."""

    def __init__(self, browser, profile):
        self.browser, self.profile = browser, profile
        self.next_id = 0
        self.buf = b""
        self.exceptions = []

    def __enter__(self):
        cmd_r, self.cmd_w = os.pipe()
        self.out_r, out_w = os.pipe()
        os.set_inheritable(cmd_r, True)
        os.set_inheritable(out_w, True)

        def fds():
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)

        self.proc = subprocess.Popen(
            [self.browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--user-data-dir=" + self.profile,
             "--remote-debugging-pipe", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=fds,
            close_fds=False)
        os.close(cmd_r)
        os.close(out_w)
        return self

    def __exit__(self, *exc):
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.cmd_w)
        os.close(self.out_r)

    def send(self, method, params=None, session=None, timeout=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            while b"\0" not in self.buf:
                left = deadline - time.time()
                check(left > 0, "DevTools: no answer to %s" % method)
                r, _, _ = select.select([self.out_r], [], [], left)
                if r:
                    data = os.read(self.out_r, 65536)
                    check(data, "DevTools: chromium went away")
                    self.buf += data
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("method") == "Runtime.exceptionThrown":
                self.exceptions.append(reply["params"]["exceptionDetails"].get("text"))
            if reply.get("id") == self.next_id:
                check("error" not in reply, "DevTools %s: %r" % (method, reply.get("error")))
                return reply["result"]

    def open(self, url):
        target = self.send("Target.createTarget", {"url": url})["targetId"]
        session = self.send("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        self.send("Runtime.enable", session=session)
        return session

    def evaluate(self, session, expr):
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                      session=session)
        return r.get("result", {}).get("value")


def text_of(dom, elem_id):
    m = re.search(r'id="%s"[^>]*>([^<]*)<' % elem_id, dom)
    return m.group(1) if m else None


def js_error(dom):
    """The page's error handlers put data-js-error on <body>."""
    m = re.search(r'<body[^>]*data-js-error="([^"]*)"', dom)
    return m.group(1) if m else None


def main():
    binary, shots = sys.argv[1], sys.argv[2]
    browser = find_chromium()
    if browser is None:
        if os.environ.get("CI", "") not in ("", "0", "false"):
            print("ui-browser: FAIL: no chromium under CI (scripts/deps.sh installs it)")
            return 1
        print("ui-browser: no chromium (Debian: apt-get install chromium); skipping")
        return 77
    os.makedirs(shots, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="tierkv-chromium-")
    cluster = tkcluster.Cluster(binary, 3)
    cluster.start()
    try:
        leader = cluster.wait_leader(timeout=30)
        follower = next(nd for nd in cluster.nodes if nd.id != leader)
        url = "http://127.0.0.1:%d/ui" % follower.http_port

        # 1. The answer itself.
        st, hdrs, body = tkcluster.request(follower.http_port, "GET", "/ui")
        check(st == 200, "/ui: status %d" % st)
        check(hdrs.get("content-type", "").startswith("text/html"), "/ui: %r" % hdrs)
        check(hdrs.get("access-control-allow-origin") == "*", "/ui: no CORS header")
        check(b'"id":%d,"role":"follower"' % follower.id in body, "/ui: no node status")

        # 2. The rendered page.
        t0 = time.time()
        dom = chrome(browser, profile, ["--virtual-time-budget=5000", "--dump-dom"], url)
        print("ui-browser: first load and render took %.1f s" % (time.time() - t0))
        check(js_error(dom) is None, "the page had a JavaScript error: %s" % js_error(dom))
        rows = re.findall(r'<tr data-member="(\d+)" data-role="([a-z_]+)"', dom)
        check(len(rows) == 3, "expected 3 member rows, got %r" % (rows,))
        leaders = [int(m) for m, role in rows if role == "leader"]
        check(leaders == [leader], "member rows say leader %r, the nodes %d" % (leaders, leader))
        check(text_of(dom, "leader") == str(leader), "leader card: %r" % text_of(dom, "leader"))
        check(text_of(dom, "up") == "3 / 3", "members up: %r" % text_of(dom, "up"))
        commit1 = int(text_of(dom, "commit"))

        # 3. Numbers move after writes.
        for i in range(30):
            st, _, _ = tkcluster.request(follower.http_port, "PUT", "/v1/kv/ui%d" % i, b"v")
            check(st == 200, "put: %d" % st)
        dom = chrome(browser, profile, ["--virtual-time-budget=5000", "--dump-dom"], url)
        check(js_error(dom) is None, "JavaScript error: %s" % js_error(dom))
        commit2 = int(text_of(dom, "commit"))
        check(commit2 >= commit1 + 30, "commit went %d -> %d after 30 writes" % (commit1, commit2))
        print("ui-browser: commit %d -> %d after 30 writes" % (commit1, commit2))

        # 4. A screenshot.
        png = os.path.join(shots, "ui.png")
        if os.path.exists(png):
            os.unlink(png)
        chrome(browser, profile, ["--virtual-time-budget=5000", "--hide-scrollbars",
                                  "--window-size=1000,1100", "--screenshot=" + png], url)
        check(os.path.getsize(png) > 10000, "no screenshot at %s" % png)
        print("ui-browser: screenshot %s" % png)

        # 5. Failover, in real time: the page stays open (DevTools over a pipe)
        # while the leader is killed; the leader card is read every 50 ms.
        with DevTools(browser, profile) as dt:
            session = dt.open(url)
            deadline = time.time() + 60
            while dt.evaluate(session, "document.getElementById('up').textContent") != "3 / 3":
                check(time.time() < deadline, "the live page never showed 3 members up")
                time.sleep(0.1)
            t_kill = time.time()
            cluster.node(leader).kill()
            shown = None
            while time.time() < t_kill + 30:
                txt = dt.evaluate(session, "document.getElementById('leader').textContent")
                if txt and txt.isdigit() and int(txt) not in (0, leader):
                    shown = int(txt)
                    break
                time.sleep(0.05)
            took = time.time() - t_kill
            err = dt.evaluate(session, "document.body.getAttribute('data-js-error')")
            check(err is None, "JavaScript error: %s" % err)
            check(dt.exceptions == [], "JavaScript exceptions: %r" % dt.exceptions)
        check(shown is not None, "the page never showed a new leader within 30 s")
        new_leader = cluster.wait_leader(timeout=30, exclude=(leader,))
        check(shown == new_leader, "the page shows %d; the nodes agree on %d" %
              (shown, new_leader))
        print("ui-browser: leader %d killed; the page showed leader %d after %.2f s" %
              (leader, new_leader, took))
        check(took <= 10.0, "the new leader showed only after %.1f s (limit 10 s)" % took)

        # 6. The page outlives its node: the killed node back, the page is
        # loaded from the leader, and that leader killed. The page must show
        # its own node down (with when it last answered) and the leader the
        # other members elect, read every 50 ms.
        cluster.node(leader).start()
        lead2 = cluster.wait_leader(timeout=30)
        url2 = "http://127.0.0.1:%d/ui" % cluster.node(lead2).http_port
        with DevTools(browser, profile) as dt:
            session = dt.open(url2)
            deadline = time.time() + 60
            while dt.evaluate(session, "document.getElementById('up').textContent") != "3 / 3":
                check(time.time() < deadline, "the leader's page never showed 3 members up")
                time.sleep(0.1)
            t_kill = time.time()
            cluster.node(lead2).kill()
            probe = ("[document.getElementById('leader').textContent,"
                     " document.getElementById('selfstate')?.textContent ?? '',"
                     " document.querySelector('tr[data-member=\"%d\"]')"
                     "?.getAttribute('data-role') ?? '',"
                     " document.getElementById('up').textContent]" % lead2)
            seen, ok = None, False
            while time.time() < t_kill + 30:
                seen = dt.evaluate(session, probe) or ["", "", "", ""]
                ldr, selfstate, role, up = seen
                if (ldr.isdigit() and int(ldr) not in (0, lead2) and
                        selfstate.startswith("down (last answered") and
                        role == "unreachable" and up == "2 / 3"):
                    ok = True
                    break
                time.sleep(0.05)
            took2 = time.time() - t_kill
            err = dt.evaluate(session, "document.body.getAttribute('data-js-error')")
            check(err is None, "JavaScript error: %s" % err)
            check(dt.exceptions == [], "JavaScript exceptions: %r" % dt.exceptions)
        check(ok, "30 s after its node %d was killed the page shows [leader, self, its row, "
              "up] = %r" % (lead2, seen))
        lead3 = cluster.wait_leader(timeout=30, exclude=(lead2,))
        check(int(seen[0]) == lead3, "the page shows leader %s; the nodes agree on %d" %
              (seen[0], lead3))
        print("ui-browser: node %d (serving the page, leader) killed; after %.2f s the page "
              "showed it %r and leader %d" % (lead2, took2, seen[1], lead3))
        check(took2 <= 10.0, "the page took %.1f s to show its node down and the new leader "
              "(limit 10 s)" % took2)
        print("ui-browser: ok")
        return 0
    except Fail as e:
        print("ui-browser: FAIL: %s (logs in %s)" % (e, cluster.dir))
        for nd in cluster.nodes:
            print("--- n%d ---\n%s" % (nd.id, nd.log()[-1500:]))
        return 1
    finally:
        cluster.stop()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
