#!/usr/bin/env python3
"""The StatefulSet of deploy/k8s simulated on Docker (issue 51): containers
named and addressed as its pods are (tierkv-N, DNS tierkv-N.tierkv-peer on a
private network), with the manifest's environment, the same entrypoint
(tierkv-k8s-entrypoint), its securityContext (uid 10001, read-only root,
tmpfs /run/tierkv and /tmp, no capabilities), a volume per pod, and what the
kubelet does around them (preStop, then SIGTERM; readiness = /readyz 200).
The one difference: TIERKV_K8S_CLIENT lists the pods' HTTP addresses, as a
Service would route to the ready ones.

Under continuous writes (one writer, unique keys, every acknowledged one
recorded) it:
  1. bootstraps 3 pods at once (podManagementPolicy Parallel);
  2. scales to 5 (tierkv-3, tierkv-4 join as learners, promoted) and back to 3
     (preStop removes them; their volumes are deleted, whenScaled: Delete);
  3. deletes tierkv-1 and recreates it with its volume (rejoins as node 2);
  4. deletes tierkv-2 and recreates it without its volume (refused as
     amnesiac, joins as 1003 by itself);
  5. rolls an upgrade one pod at a time (tierkv-2, 1, 0; each waits for the
     one before to be ready).
Then every acknowledged write must be readable, every member's digest equal,
and each rolled pod must cost at most one leader change. Prints a timeline.

With --tierkvd and --tierkv it first builds the image from these binaries
(deploy/build-images.sh, offline: a debootstrapped base the first time, kept
for the next runs) as IMAGE; the entrypoint is added in an image of its own
(twice: the versions the upgrade rolls between). Exit 77 (skip) when no
Docker engine answers.
  usage: sim_statefulset.py SOURCE_DIR IMAGE [--tierkvd PATH --tierkv PATH]
"""
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

SRC, BASE_IMAGE = sys.argv[1], sys.argv[2]
BINARIES = sys.argv[3:]
TAG = "tierkv-k8s-sim-%d" % os.getpid()
NET = TAG
STOP = threading.Event()


class Fail(Exception):
    pass


def log(msg):
    print("%8.1f  %s" % (time.monotonic() - T0, msg), flush=True)


def sh(args, timeout=120, check=True):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise Fail("%s: exit %d: %s" % (" ".join(args), r.returncode, r.stderr.strip()[:400]))
    return r.stdout.strip()


def wait_until(what, timeout_s, fn, interval_s=0.25):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
        except (OSError, http.client.HTTPException, ValueError) as e:
            last = e
        time.sleep(interval_s)
    raise Fail("%s: not within %ds (last error: %r)" % (what, timeout_s, last))


def req(ip, method, path, body=None, timeout=5):
    c = http.client.HTTPConnection(ip, 8080, timeout=timeout)
    try:
        c.request(method, path, body=body)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


class Pods:
    def __init__(self, token_dir):
        self.token_dir = token_dir
        self.ip = {}

    def volume(self, n):
        return "%s-data-tierkv-%d" % (TAG, n)

    def run(self, n, image):
        name = "tierkv-%d" % n
        clients = ",".join("tierkv-%d.tierkv-peer:8080" % i for i in range(5))
        sh(["docker", "run", "-d", "--name", "%s-%s" % (TAG, name), "--hostname", name,
            "--network", NET, "--network-alias", "%s.tierkv-peer" % name,
            "--user", "10001:10001", "--read-only", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--memory", "1g",
            "--tmpfs", "/run/tierkv:uid=10001,gid=10001,mode=0700",
            "--tmpfs", "/tmp:uid=10001,gid=10001",
            "-v", "%s:/var/lib/tierkv" % self.volume(n),
            "-v", "%s:/etc/tierkv/peer:ro" % self.token_dir,
            "-e", "TIERKV_K8S_POD_NAME=" + name, "-e", "TIERKV_K8S_STATEFULSET=tierkv",
            "-e", "TIERKV_K8S_PEER_SERVICE=tierkv-peer", "-e", "TIERKV_K8S_CLIENT=" + clients,
            "-e", "TIERKV_K8S_INITIAL_SIZE=3", "-e", "TIERKV_K8S_MEMORY_LIMIT_MI=1024",
            "-e", "TIERKV_STORE=fs", "-e", "TIERKV_TICK_MS=10", "-e", "TIERKV_ELECTION_TICKS=20",
            "--entrypoint", "/usr/local/bin/tierkv-k8s-entrypoint", image])
        self.ip[n] = sh(["docker", "inspect", "-f",
                         "{{(index .NetworkSettings.Networks \"%s\").IPAddress}}" % NET,
                         "%s-%s" % (TAG, name)])

    def delete(self, n, volume=False):
        """As the kubelet deletes a pod: preStop, then SIGTERM (grace 90 s)."""
        c = "%s-tierkv-%d" % (TAG, n)
        sh(["docker", "exec", c, "/usr/local/bin/tierkv-k8s-entrypoint", "prestop"],
           timeout=120, check=False)
        sh(["docker", "stop", "-t", "90", c], timeout=120)
        sh(["docker", "rm", c])
        self.ip.pop(n, None)
        if volume:
            sh(["docker", "volume", "rm", self.volume(n)])

    def ready(self, n):
        st, _ = req(self.ip[n], "GET", "/readyz", timeout=2)
        return st == 200

    def wait_ready(self, ns, timeout_s=180):
        for n in ns:
            wait_until("tierkv-%d ready" % n, timeout_s, lambda n=n: self.ready(n))

    def cluster(self, n):
        st, b = req(self.ip[n], "GET", "/v1/cluster", timeout=2)
        return json.loads(b) if st == 200 else None


def entrypoint_said(n):
    """The entrypoint's own lines in the pod's log."""
    out = subprocess.run(["docker", "logs", "%s-tierkv-%d" % (TAG, n)],
                         capture_output=True, text=True)
    return [x for x in (out.stdout + out.stderr).splitlines()
            if x.startswith("tierkv-k8s-entrypoint:")]


def voters(pods):
    """The voters as the leader's /v1/members shows them, committed."""
    for n, ip in list(pods.ip.items()):
        try:
            st, b = req(ip, "GET", "/v1/members", timeout=2)
        except (OSError, http.client.HTTPException):
            continue
        if st != 200:
            continue
        j = json.loads(b)
        if j.get("leader") and j.get("committed"):
            return sorted(m["id"] for m in j["members"] if m["role"] == "voter")
    return None


class Writer(threading.Thread):
    def __init__(self, pods):
        super().__init__(daemon=True)
        self.pods = pods
        self.acked = {}
        self.lost_tries = 0
        self.err = None

    def run(self):
        i = 0
        while not STOP.is_set():
            key, val = "w/%06d" % i, "v%d" % i
            for _ in range(600):
                if STOP.is_set():
                    return
                ok = False
                for n, ip in sorted(self.pods.ip.items()):
                    try:
                        st, _ = req(ip, "PUT", "/v1/kv/" + urllib.parse.quote(key, safe=""),
                                     val.encode(), timeout=3)
                    except (OSError, http.client.HTTPException):
                        continue
                    if st == 200:
                        ok = True
                        break
                if ok:
                    self.acked[key] = val
                    break
                self.lost_tries += 1
                time.sleep(0.05)
            else:
                self.err = "write %s not acknowledged for 60 s" % key
                return
            i += 1
            time.sleep(0.01)


class LeaderWatch(threading.Thread):
    """Leader changes seen by polling every pod's /v1/cluster."""

    def __init__(self, pods):
        super().__init__(daemon=True)
        self.pods = pods
        self.leader = None
        self.changes = 0

    def run(self):
        while not STOP.is_set():
            seen = set()
            for n, ip in list(self.pods.ip.items()):
                try:
                    st, b = req(ip, "GET", "/v1/cluster", timeout=1)
                    if st == 200:
                        j = json.loads(b)
                        if j.get("leader"):
                            seen.add((j["term"], j["leader"]))
                except (OSError, http.client.HTTPException, ValueError):
                    pass
            if seen:
                top = max(seen)
                if self.leader is not None and top[1] != self.leader[1] and top[0] > self.leader[0]:
                    self.changes += 1
                if self.leader is None or top[0] >= self.leader[0]:
                    self.leader = top
            time.sleep(0.1)


def main():
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        print("no Docker engine answers: skipped")
        return 77
    if BINARIES:
        log("building %s (deploy/build-images.sh)" % BASE_IMAGE)
        sh([os.path.join(SRC, "deploy/build-images.sh")] + BINARIES + ["--tag", BASE_IMAGE],
           timeout=1200)
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode:
        print("FAIL: no image %s (give --tierkvd and --tierkv to build it)" % BASE_IMAGE)
        return 1
    tmp = tempfile.mkdtemp()
    ctx = os.path.join(tmp, "ctx")
    os.mkdir(ctx)
    tok = os.path.join(tmp, "peer")
    os.mkdir(tok)
    with open(os.path.join(tok, "peer-token"), "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    os.chmod(tok, 0o755)
    os.chmod(os.path.join(tok, "peer-token"), 0o644)
    images = []
    for v in (1, 2):
        with open(os.path.join(ctx, "Dockerfile"), "w") as f:
            f.write("FROM %s\nCOPY tierkv-k8s-entrypoint /usr/local/bin/\n"
                    "LABEL org.tierkv.sim-version=%d\n" % (BASE_IMAGE, v))
        sh(["cp", os.path.join(SRC, "deploy/k8s/tierkv-k8s-entrypoint"), ctx])
        sh(["docker", "build", "-q", "-t", "%s:%d" % (TAG, v), ctx], timeout=300)
        images.append("%s:%d" % (TAG, v))
    sh(["docker", "network", "create", NET])
    pods = Pods(tok)
    timeline = []
    rc = 1
    writer = watch = None
    try:
        def step(name, fn):
            t = time.monotonic()
            c0 = watch.changes if watch else 0
            a0 = len(writer.acked) if writer else 0
            log("-> " + name)
            fn()
            d = time.monotonic() - t
            timeline.append((name, d, (watch.changes - c0) if watch else 0,
                             (len(writer.acked) - a0) if writer else 0))
            log("<- %s: %.1f s" % (name, d))
            if writer and writer.err:
                raise Fail(writer.err)

        def bootstrap():
            for n in range(3):
                pods.run(n, images[0])
            pods.wait_ready(range(3))
            wait_until("voters 1,2,3", 60, lambda: voters(pods) == [1, 2, 3])

        step("bootstrap 3", bootstrap)
        writer = Writer(pods)
        watch = LeaderWatch(pods)
        writer.start()
        watch.start()

        def grow():
            pods.run(3, images[0])
            pods.run(4, images[0])
            pods.wait_ready([3, 4])
            wait_until("voters 1-5", 180, lambda: voters(pods) == [1, 2, 3, 4, 5])

        step("scale 3 -> 5", grow)

        def shrink():
            t = [threading.Thread(target=pods.delete, args=(n, True)) for n in (4, 3)]
            for x in t:
                x.start()
            for x in t:
                x.join()
            wait_until("voters 1,2,3", 60, lambda: voters(pods) == [1, 2, 3])

        step("scale 5 -> 3", shrink)

        def with_volume():
            pods.delete(1)
            pods.run(1, images[0])
            pods.wait_ready([1])
            wait_until("voters 1,2,3", 60, lambda: voters(pods) == [1, 2, 3])

        step("delete tierkv-1, recreate with its volume", with_volume)

        def without_volume():
            pods.delete(2, volume=True)
            pods.run(2, images[0])
            wait_until("voters 1,2,1003", 240, lambda: voters(pods) == [1, 2, 1003])
            pods.wait_ready([2])
            said = entrypoint_said(2)
            for line in said:
                log("tierkv-2: " + line)
            if not any("the cluster refuses node 3" in x for x in said):
                raise Fail("tierkv-2 took a new id without being refused as node 3")

        step("delete tierkv-2, recreate without its volume", without_volume)

        for n in (2, 1, 0):
            def roll(n=n):
                pods.delete(n)
                pods.run(n, images[1])
                pods.wait_ready([n])
                time.sleep(5)  # minReadySeconds
            step("upgrade tierkv-%d" % n, roll)

        STOP.set()
        writer.join(10)
        watch.join(5)
        # Every acknowledged write readable, every member's digest equal.
        ip = pods.ip[0]
        missing = 0
        for k, v in writer.acked.items():
            st, b = req(ip, "GET", "/v1/kv/" + urllib.parse.quote(k, safe=""))
            if st != 200 or json.loads(b).get("value") != v:
                missing += 1
        log("acknowledged writes: %d, lost: %d, unacknowledged tries: %d" %
            (len(writer.acked), missing, writer.lost_tries))

        def same():
            d = []
            for n in sorted(pods.ip):
                st, b = req(pods.ip[n], "GET", "/v1/debug/digest")
                if st != 200:
                    return False
                d.append(json.loads(b))
            return len({(x["applied"], x["digest"]) for x in d}) == 1 and d

        for n in sorted(pods.ip):
            for line in entrypoint_said(n):
                log("tierkv-%d: %s" % (n, line))
        d = wait_until("equal digests", 60, same)
        log("digests: %s" % d[0])
        print("\ntimeline:\n%-48s %8s %8s %8s" % ("step", "seconds", "leaders", "acked"))
        for name, sec, ch, ack in timeline:
            print("%-48s %8.1f %8d %8d" % (name, sec, ch, ack))
        bad_rolls = [x for x in timeline if x[0].startswith("upgrade") and x[2] > 1]
        if missing:
            raise Fail("%d acknowledged writes are not readable" % missing)
        if bad_rolls:
            raise Fail("more than one leader change while rolling: %s" % bad_rolls)
        rc = 0
    except Fail as e:
        print("FAIL: %s" % e, flush=True)
        for n in range(5):
            c = "%s-tierkv-%d" % (TAG, n)
            out = subprocess.run(["docker", "logs", "--tail", "30", c], capture_output=True,
                                 text=True)
            if out.returncode == 0:
                print("---- %s\n%s%s" % (c, out.stdout, out.stderr))
    finally:
        STOP.set()
        for n in range(5):
            subprocess.run(["docker", "rm", "-f", "%s-tierkv-%d" % (TAG, n)], capture_output=True)
            subprocess.run(["docker", "volume", "rm", pods.volume(n)], capture_output=True)
        subprocess.run(["docker", "network", "rm", NET], capture_output=True)
        for im in images:
            subprocess.run(["docker", "rmi", im], capture_output=True)
        subprocess.run(["rm", "-rf", tmp])
    return rc


T0 = time.monotonic()
if __name__ == "__main__":
    sys.exit(main())
