#!/usr/bin/env python3
"""End-to-end test of the docker-compose deployment (deploy/).

Builds the image with deploy/build-images.sh (offline: it debootstraps the
base image when no registry answers), starts deploy/docker-compose.yml as its
own compose project on free host ports, through the deploy/compose wrapper
(`docker compose` or `docker-compose`, whichever exists), then:
  1. waits until every node answers /readyz and Docker reports it healthy;
     checks the container runs as a non-root user with its data in a volume;
     `tierkv status` inside each container reaches all three nodes (the
     members advertise node1:8080 ..., which answer on the compose network);
     the raft port is authenticated: every node reads the same peer token,
     made on the first `up` by the image's entrypoint (the image holds
     none), each node's PID 1 is tierkvd with that token file (mode 0600,
     owner tierkv), `docker run IMAGE` without a token exits 2 saying how to
     give one (--version, --help and the CLI still run), and an impostor with
     another token put in a follower's place (its address and id) is refused
     by the leader (tierkv_transport_auth_failures_total) which keeps its term;
  2. writes 1,000 keys through every node (followers forward to the leader);
  3. kills the leader's container (SIGKILL) and keeps writing through the
     other two; starts it again; checks that all three converge: the same
     full scan (stale reads, every key's value and revisions) on each node,
     holding every acknowledged write, and the same state digest
     (/v1/debug/digest) at the same applied index;
  4. disconnects the current leader from the compose network: the majority
     elects a leader and keeps serving writes and linearizable reads, while
     the isolated node refuses linearizable reads and writes (but still
     answers stale reads, so it is up); reconnects it under its service name
     (a DNS alias) at another address (a placeholder container holds the old
     one), so the majority finds it only by name (the members are node1:7000,
     ...: no fixed IPs), and checks convergence (scans and digests) again;
  5. deletes a follower's volume and recreates its container under the same
     id: the cluster refuses it (its /readyz answers 503 not_a_member, its log
     says what to do, the leader counts the refusal in
     tierkv_member_refused_total); then follows docs/operations.md "Replace a
     failed node": `tierkv member remove`, a new container node4 started with
     TIERKV_JOIN, `tierkv member add 4` (with the tierkv CLI on the host), and
     checks convergence (scans and digests) on the new three;
  6. tears everything down (compose down -v), also on failure or SIGTERM, and
     checks that no container, network or volume of the project is left.
Every wait is bounded. Exits 77 (skip) with a message when no Docker engine
or no compose answers.

  compose_e2e.py --tierkvd PATH --tierkv PATH [--keep] [--keys N]
  compose_e2e.py --self-test     (the checkers reject known-bad cases; no Docker)

Only the Python standard library.
"""
import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
COMPOSE_FILE = os.path.join(DEPLOY, "docker-compose.yml")
COMPOSE_WRAPPER = os.path.join(DEPLOY, "compose")
SKIP = 77
T0 = time.monotonic()


class Fail(Exception):
    pass


class Interrupted(BaseException):
    """SIGTERM/SIGINT: not a Fail, so no retry loop swallows it."""


# Set on interruption: worker threads stop at their next request.
STOP = threading.Event()


def log(msg):
    print("[%6.1fs] %s" % (time.monotonic() - T0, msg), flush=True)


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def run(args, timeout, check_rc=True, env=None, capture=True):
    """Runs a command with a hard timeout; returns (rc, stdout, stderr)."""
    try:
        p = subprocess.run(args, timeout=timeout, env=env, text=True,
                           stdout=subprocess.PIPE if capture else None,
                           stderr=subprocess.PIPE if capture else None)
    except subprocess.TimeoutExpired:
        raise Fail("timed out after %ds: %s" % (timeout, " ".join(args)))
    if check_rc and p.returncode != 0:
        raise Fail("%s exited %d: %s" % (" ".join(args), p.returncode,
                                          (p.stderr or "").strip()[-2000:]))
    return p.returncode, p.stdout or "", p.stderr or ""


def wait_until(what, timeout_s, fn, interval_s=0.25):
    """Calls fn() until it returns a true value; Fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            v = fn()
            if v:
                return v
        except (OSError, http.client.HTTPException, ValueError, Fail) as e:
            last = e
        if time.monotonic() > deadline:
            raise Fail("%s: not within %ds%s" % (what, timeout_s,
                                                  " (last error: %s)" % last if last else ""))
        time.sleep(interval_s)


# ---- environment ---------------------------------------------------------

def docker_answers():
    try:
        p = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                           timeout=30, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    except FileNotFoundError:
        return None, "the docker command is not installed"
    except subprocess.TimeoutExpired:
        return None, "'docker info' did not answer within 30 s"
    if p.returncode != 0:
        lines = p.stderr.strip().splitlines()
        return None, "'docker info' failed" + (": " + lines[-1] if lines else "")
    return p.stdout.strip(), None


def compose_command():
    """deploy/compose (which runs `docker compose`, the v2 plugin, if present,
    else `docker-compose`, v1) and the command it picks with its version; None
    when it finds neither."""
    try:
        p = subprocess.run([COMPOSE_WRAPPER, "--which"], timeout=60, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except subprocess.TimeoutExpired:
        return None, None
    if p.returncode != 0:
        return None, None
    picked = p.stdout.split(" -f ")[0].strip()
    v = subprocess.run(picked.split() + ["version"], timeout=60, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return [COMPOSE_WRAPPER], "%s: %s" % (picked, (v.stdout.strip().splitlines() or ["?"])[0])


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


# ---- HTTP ----------------------------------------------------------------

class Client:
    """One keep-alive HTTP connection to one published node port."""

    def __init__(self, port, timeout_s=10):
        self.port = port
        self.timeout_s = timeout_s
        self.conn = None

    def request(self, method, path, body=None):
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                       timeout=self.timeout_s)
            try:
                self.conn.request(method, path, body=body)
                r = self.conn.getresponse()
                data = r.read()
                if r.getheader("Connection", "").lower() == "close":
                    self.close()
                return r.status, dict(r.getheaders()), data
            except (http.client.RemoteDisconnected, BrokenPipeError,
                    ConnectionResetError) as e:
                # A kept-alive connection the server closed: once more, fresh.
                self.close()
                if attempt == 1:
                    raise e
            except Exception:
                self.close()
                raise
        raise AssertionError("unreachable")

    def json(self, method, path, body=None):
        st, hdrs, data = self.request(method, path, body)
        try:
            return st, json.loads(data) if data else None
        except ValueError:
            raise Fail("%s %s on port %d: status %d, not JSON: %r" %
                       (method, path, self.port, st, data[:200]))

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def q(s):
    return urllib.parse.quote(s, safe="")


# Diagnostics only (--follow-leader): send a write refused with not_leader to
# the leader named in X-Tierkv-Leader-Addr instead of insisting on this node.
FOLLOW_LEADER = False
# How long a node may keep answering not_leader (a follower that knows the
# leader but does not forward) before that is a failure, not an election.
NOT_LEADER_GRACE_S = 10


def put_until_acked(cl, key, value, deadline_s, stats):
    """PUT key=value through this node until it is acknowledged (200), retrying
    503s and connection errors; Fail when deadline_s passes. Rewriting the same
    value after an unknown outcome is harmless."""
    deadline = time.monotonic() + deadline_s
    last = None
    not_leader_since = None
    while True:
        try:
            st, hdrs, data = cl.request("PUT", "/v1/kv/" + q(key), value.encode())
            if st == 200:
                return
            last = "HTTP %d %s" % (st, data[:160].decode(errors="replace"))
            check(st in (503, 504), "PUT %s on port %d: %s" % (key, cl.port, last))
            if b'"not_leader"' in data:
                addr = hdrs.get("X-Tierkv-Leader-Addr", "")
                if FOLLOW_LEADER and addr.startswith("127.0.0.1:"):
                    other = Client(int(addr.split(":")[1]))
                    try:
                        st2, _, _ = other.request("PUT", "/v1/kv/" + q(key), value.encode())
                    finally:
                        other.close()
                    if st2 == 200:
                        return
                now = time.monotonic()
                not_leader_since = not_leader_since or now
                check(now - not_leader_since < NOT_LEADER_GRACE_S,
                      "the node on port %d keeps refusing writes with not_leader (leader "
                      "%s) for %ds: a follower must forward writes to the leader "
                      "(DESIGN.md, the path of a write)" %
                      (cl.port, hdrs.get("X-Tierkv-Leader"), NOT_LEADER_GRACE_S))
            else:
                not_leader_since = None
        except (OSError, http.client.HTTPException) as e:
            last = repr(e)
        stats["retries"] += 1
        if STOP.is_set():
            raise Fail("stopped")
        if time.monotonic() > deadline:
            raise Fail("PUT %s through port %d not acknowledged within %ds (last: %s)" %
                       (key, cl.port, deadline_s, last))
        time.sleep(0.1)


def write_keys(ports, prefix, n, model, deadline_s=60):
    """Writes n keys through each port concurrently (one thread per node);
    records acknowledged writes in model. Returns (seconds, retries)."""
    errors, stats = [], {"retries": 0}
    lock = threading.Lock()

    def worker(port):
        cl = Client(port)
        try:
            for i in range(n):
                if STOP.is_set():
                    return
                key = "%s/p%d/%05d" % (prefix, port, i)
                value = "v-%s-%d-%d" % (prefix, port, i)
                put_until_acked(cl, key, value, deadline_s, stats)
                with lock:
                    model[key] = value
        except Exception as e:  # reported by the main thread
            errors.append(e)
        finally:
            cl.close()

    t = time.monotonic()
    threads = [threading.Thread(target=worker, args=(p,), daemon=True) for p in ports]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0] if isinstance(errors[0], Fail) else Fail(repr(errors[0]))
    return time.monotonic() - t, stats["retries"]


def scan_all(port, prefix="k/"):
    """The node's full view of keys under prefix, by a stale scan: a sorted
    list of (key, value, version, create_revision, mod_revision)."""
    cl = Client(port)
    try:
        st, js = cl.json("GET", "/v1/kv?prefix=%s&limit=10000&consistency=stale" % q(prefix))
    finally:
        cl.close()
    check(st == 200, "scan on port %d: HTTP %d %s" % (port, st, js))
    check(not js.get("more"), "scan on port %d: more than 10000 keys" % port)
    return [(it["key"], it["value"], it.get("version"), it.get("create_revision"),
             it.get("mod_revision")) for it in js["items"]]


def cluster(port):
    cl = Client(port, timeout_s=5)
    try:
        st, js = cl.json("GET", "/v1/cluster")
    finally:
        cl.close()
    check(st == 200, "/v1/cluster on port %d: HTTP %d" % (port, st))
    return js


def ready(port):
    cl = Client(port, timeout_s=5)
    try:
        st, _, _ = cl.request("GET", "/readyz")
    finally:
        cl.close()
    return st == 200


# ---- the test ------------------------------------------------------------

class Deployment:
    def __init__(self, compose, project, env):
        self.compose = compose
        self.project = project
        self.env = env
        self.ids = {}  # node id -> container id

    def c(self, *args, timeout=180, check_rc=True):
        return run(self.compose + ["-p", self.project] + list(args),
                   timeout, check_rc=check_rc, env=self.env)

    def container(self, node):
        if node not in self.ids:
            _, out, _ = self.c("ps", "-q", "node%d" % node, timeout=60)
            check(out.strip(), "no container for node%d" % node)
            self.ids[node] = out.strip().splitlines()[0]
        return self.ids[node]

    def inspect(self, node, fmt):
        _, out, _ = run(["docker", "inspect", "-f", fmt, self.container(node)], 30)
        return out.strip()

    def leftovers(self):
        label = "label=com.docker.compose.project=" + self.project
        found = []
        for kind, cmd in (("containers", ["docker", "ps", "-aq", "--filter", label]),
                          ("networks", ["docker", "network", "ls", "-q", "--filter", label]),
                          ("volumes", ["docker", "volume", "ls", "-q", "--filter", label])):
            rc, out, _ = run(cmd, 30, check_rc=False)
            if out.split():
                found.append("%s %s" % (kind, " ".join(out.split())))
        return found

    def down_detached(self):
        """Starts `down -v` in a session of its own, so that it survives the
        SIGKILL meson sends to the test's process group 0.5 s after SIGTERM."""
        cmd = " ".join("'%s'" % w for w in
                       self.compose + ["-p", self.project, "down", "-v",
                                       "--remove-orphans", "-t", "5"])
        subprocess.Popen(["timeout", "240", "sh", "-c", cmd + " >/dev/null 2>&1"],
                         env=self.env, start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)

    def down(self):
        t = time.monotonic()
        rc, _, err = self.c("down", "-v", "--remove-orphans", "-t", "10", timeout=240,
                            check_rc=False)
        if rc != 0:
            log("compose down failed: %s" % err.strip()[-500:])
        left = self.leftovers()
        if left:
            # Force the rest out, then report the failure to clean up.
            for kind_ids in left:
                kind, ids = kind_ids.split(" ", 1)
                cmd = {"containers": ["docker", "rm", "-f", "-v"],
                       "networks": ["docker", "network", "rm"],
                       "volumes": ["docker", "volume", "rm", "-f"]}[kind]
                run(cmd + ids.split(), 120, check_rc=False)
        return time.monotonic() - t, left


def leader_of(ports_by_node, nodes):
    """The leader id all reachable `nodes` agree on (and that is one of them),
    else None."""
    seen = set()
    for n in nodes:
        js = cluster(ports_by_node[n])
        seen.add(js.get("leader"))
    if len(seen) == 1:
        ld = seen.pop()
        if ld in nodes:
            return ld
    return None


def converge(what, ports, model, timeout_s=90, scan=scan_all):
    """Waits until every port's full scan is identical and holds every
    acknowledged write of model; returns the scan."""
    state = {}

    def same():
        scans = [scan(p) for p in ports]
        state["scans"] = scans
        if any(s != scans[0] for s in scans[1:]):
            return False
        got = {k: v for (k, v, _, _, _) in scans[0]}
        missing = [k for k in model if got.get(k) != model[k]]
        state["missing"] = missing
        return not missing

    try:
        wait_until(what, timeout_s, same, interval_s=0.5)
    except Fail:
        scans = state.get("scans")
        detail = ""
        if scans:
            detail = "; keys per node %s" % [len(s) for s in scans]
            if state.get("missing"):
                detail += "; %d acknowledged writes missing, e.g. %s" % (
                    len(state["missing"]), state["missing"][:3])
        raise Fail("%s: the three nodes did not converge within %ds%s" %
                   (what, timeout_s, detail))
    return state["scans"][0]


class Diverged(Exception):
    """Two replicas at the same applied index hold different states: no
    amount of waiting fixes that (not a Fail, so wait_until does not retry)."""


def digest_of(port):
    """(applied index, digest) of the node's applied state, read locally."""
    cl = Client(port, timeout_s=5)
    try:
        st, js = cl.json("GET", "/v1/debug/digest")
    finally:
        cl.close()
    check(st == 200, "/v1/debug/digest on port %d: HTTP %d %s" % (port, st, js))
    check(isinstance(js.get("applied"), int) and isinstance(js.get("digest"), str),
          "/v1/debug/digest on port %d: %s" % (port, js))
    return js["applied"], js["digest"]


def same_digest(what, ports, timeout_s=60, digest=digest_of):
    """Waits (at most timeout_s) until every port reports the same applied
    index, then requires the same digest: replicas that applied the same
    entries must hold the same state. Returns (applied, digest)."""
    state = {}

    def level():
        got = [digest(p) for p in ports]
        state["got"] = got
        if len({a for a, _ in got}) != 1:
            return None
        if len({d for _, d in got}) != 1:
            raise Diverged("%s: the nodes differ at applied index %d: digests %s" %
                           (what, got[0][0], dict(zip(ports, (d for _, d in got)))))
        return got[0]

    try:
        return wait_until(what, timeout_s, level, interval_s=0.25)
    except Diverged as e:
        raise Fail(str(e))
    except Fail:
        raise Fail("%s: the applied indexes did not meet within %ds (last: %s)" %
                   (what, timeout_s, dict(zip(ports, state.get("got", [])))))


def exec_cli(dep, node, args, timeout_s=20):
    """Runs the tierkv CLI inside node's container against its own HTTP port;
    returns (exit code, output)."""
    rc, out, err = run(["docker", "exec", dep.container(node), "timeout", str(timeout_s - 5),
                        "tierkv", "--endpoints", "127.0.0.1:8080", "--timeout", "3s",
                        "--retries", "0"] + args, timeout_s, check_rc=False)
    return rc, (out + err).strip()


def metric(port, name):
    c = Client(port)
    try:
        st, _, body = c.request("GET", "/metrics")
    finally:
        c.close()
    for ln in body.decode().splitlines() if st == 200 else []:
        if ln.startswith(name + " "):
            return float(ln.split()[-1])
    return None


def readyz_code(port):
    c = Client(port, timeout_s=3)
    try:
        st, js = c.json("GET", "/readyz")
        return js["error"]["code"] if st == 503 and js else str(st)
    except Exception:
        return None
    finally:
        c.close()


def replace_node(a, dep, port_of, model, net_name, extra):
    """Step 5 (see the docstring): an amnesiac refused, then replaced by node4
    following docs/operations.md."""
    leader = wait_until("an agreed leader", 30, lambda: leader_of(port_of, (1, 2, 3)))
    victim = [n for n in (1, 2, 3) if n != leader][0]
    survivors = [n for n in (1, 2, 3) if n != victim]
    vol = "%s_node%d-data" % (a.project, victim)
    dep.c("rm", "-f", "-s", "node%d" % victim, timeout=120)
    dep.ids.pop(victim, None)
    run(["docker", "volume", "rm", vol], 60)
    dep.c("up", "-d", "--no-deps", "node%d" % victim, timeout=120)
    log("node%d: volume %s deleted, container recreated under the same id" % (victim, vol))
    wait_until("node%d /readyz 503 not_a_member" % victim, 90,
               lambda: readyz_code(port_of[victim]) == "not_a_member")
    _, lo, le = run(["docker", "logs", dep.container(victim)], 30)
    check("refused this node" in lo + le, "node%d's log does not say it was refused" % victim)
    refused = wait_until("the refusal counted", 30,
                         lambda: sum(metric(port_of[n], "tierkv_member_refused_total") or 0
                                     for n in survivors))
    log("node%d is refused under its old id (/readyz 503 not_a_member; %d refusals "
        "counted by the others)" % (victim, refused))
    # docs/operations.md "Replace a failed node", with the CLI on the host.
    eps = ",".join("127.0.0.1:%d" % port_of[n] for n in survivors)
    rc, out, err = run([a.tierkv, "-e", eps, "member", "remove", str(victim)], 60,
                       check_rc=False)
    check(rc == 0, "tierkv member remove %d: exit %d: %s %s" % (victim, rc, out, err))
    dep.c("rm", "-f", "-s", "node%d" % victim, timeout=120)
    dep.ids.pop(victim, None)
    port4 = free_ports(1)[0]
    name, vol4 = "%s-node4" % a.project, "%s_node4-data" % a.project
    label = "com.docker.compose.project=%s" % a.project
    run(["docker", "volume", "create", "--label", label, vol4], 60)
    extra.append(("volume", vol4))
    members = ",".join("%d=node%d:7000" % (n, n) for n in survivors)
    env = {"TIERKV_ID": "4", "TIERKV_JOIN": "1", "TIERKV_MEMBERS": members,
           "TIERKV_LISTEN_RAFT": "0.0.0.0:7000", "TIERKV_LISTEN_HTTP": "0.0.0.0:8080",
           "TIERKV_DATA_DIR": "/var/lib/tierkv", "TIERKV_STORE": "fs",
           "TIERKV_CLUSTER_ID": "1",
           "TIERKV_PEER_TOKEN_FILE": "/var/lib/tierkv-secrets/peer-token"}
    args = ["docker", "run", "-d", "--name", name, "--label", label, "--network", net_name,
            "--network-alias", "node4", "-p", "127.0.0.1:%d:8080" % port4,
            "-v", "%s:/var/lib/tierkv" % vol4,
            "-v", "%s_secrets:/var/lib/tierkv-secrets" % a.project]
    for k, v in env.items():
        args += ["-e", "%s=%s" % (k, v)]
    run(args + [a.image], 120)
    extra.append(("container", name))
    rc, out, err = run([a.tierkv, "-e", eps, "--timeout", "60s", "member", "add", "4",
                        "--raft", "node4:7000", "--http", "node4:8080"], 120, check_rc=False)
    check(rc == 0, "tierkv member add 4: exit %d: %s %s" % (rc, out, err))
    rc, out, err = run([a.tierkv, "-e", eps, "member", "list"], 60, check_rc=False)
    log("replaced node%d by node4 (tierkv member remove, tierkvd --join, tierkv member "
        "add):\n%s" % (victim, out.rstrip()))
    check(rc == 0 and sum(1 for ln in out.splitlines() if " voter " in ln) == 3,
          "three voters after the replacement: %s" % out)
    ports = [port_of[n] for n in survivors] + [port4]
    wait_until("node4 /readyz", 90, lambda: ready(port4))
    scan = converge("after replacing node%d" % victim, ports, model)
    applied, digest = same_digest("digests after replacing node%d" % victim, ports)
    log("node4 holds the same %d keys and digest %s at applied index %d" %
        (len(scan), digest, applied))

TOKEN_PATH = "/var/lib/tierkv-secrets/peer-token"


def check_node_token(n, argv, environ, mode_owner):
    """A node's PID 1 is tierkvd itself (the entrypoint exec'd it) with the
    peer token file from its environment or flags; that file is mode 0600
    and owned by the container's user tierkv (tierkvd refuses looser ones)."""
    check(argv and os.path.basename(argv[0]) == "tierkvd",
          "node%d: PID 1 is %s, not tierkvd" % (n, argv))
    path = None
    for kv in environ:
        if kv.startswith("TIERKV_PEER_TOKEN_FILE="):
            path = kv.split("=", 1)[1] or None
    for i, arg in enumerate(argv):
        if arg == "--peer-token-file" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--peer-token-file="):
            path = arg.split("=", 1)[1]
    check(path == TOKEN_PATH, "node%d: tierkvd's peer token file is %r, not %s" %
          (n, path, TOKEN_PATH))
    check(mode_owner == "600 tierkv", "node%d: %s is mode and owner %r, not '600 tierkv'" %
          (n, TOKEN_PATH, mode_owner))


def check_image_refuses(image):
    """`docker run IMAGE` without a token exits 2 saying how to give one;
    --version, --help and the CLI still work."""
    rc, out, err = run(["docker", "run", "--rm", image], 60, check_rc=False)
    check(rc == 2 and "openssl rand -hex 32" in err and "TIERKV_PEER_TOKEN_FILE" in err,
          "docker run %s without a token: exit %d (want 2 and how to give one): %s %s" %
          (image, rc, out, err))
    first = err.strip().splitlines()[0]
    for env in (["-e", "TIERKV_INSECURE_PEERS=false"],
                ["-e", "TIERKV_PEER_TOKEN_FILE=/nonexistent/peer-token"]):
        rc2, out2, err2 = run(["docker", "run", "--rm"] + env + [image], 60, check_rc=False)
        check(rc2 == 2, "docker run %s %s: exit %d, want 2: %s %s" %
              (" ".join(env), image, rc2, out2, err2))
    rc, out, err = run(["docker", "run", "--rm", image, "--version"], 60, check_rc=False)
    check(rc == 0 and out.startswith("tierkvd "), "docker run %s --version: exit %d: %s %s" %
          (image, rc, out, err))
    rc, out, err = run(["docker", "run", "--rm", image, "--help"], 60, check_rc=False)
    check(rc == 0 and "--peer-token-file" in out, "docker run %s --help: exit %d: %s" %
          (image, rc, err))
    rc, out, err = run(["docker", "run", "--rm", image, "tierkv", "--version"], 60,
                       check_rc=False)
    check(rc == 0 and out.startswith("tierkv"), "docker run %s tierkv --version: exit %d: %s %s"
          % (image, rc, out, err))
    log("docker run %s without a token exits 2 (%s); so do TIERKV_INSECURE_PEERS=false and a "
        "missing token file; --version, --help and `tierkv` still run" % (image, first))


def check_peer_auth(dep, image, port_of):
    """The raft port is authenticated: every node reads one token, made on
    the first `up` (not in the image); an impostor with another token in a
    member's place (its address and id) is refused by the leader (counted on
    /metrics, its log saying why) while the leader and term stay."""
    tokens = set()
    for n in (1, 2, 3):
        rc, out, _ = run(["docker", "exec", dep.container(n), "sh", "-c",
                          'cat "$TIERKV_PEER_TOKEN_FILE"'], 30, check_rc=False)
        tok = out.strip()
        check(rc == 0 and len(tok) == 64 and all(c in "0123456789abcdef" for c in tok),
              "node%d: no 64-hex peer token in $TIERKV_PEER_TOKEN_FILE (exit %d)" % (n, rc))
        tokens.add(tok)
    check(len(tokens) == 1, "the three nodes read %d different peer tokens" % len(tokens))
    for n in (1, 2, 3):
        rc, out, _ = run(["docker", "exec", dep.container(n), "sh", "-c",
                          "tr '\\0' '\\n' </proc/1/cmdline; echo '--env--'; "
                          "tr '\\0' '\\n' </proc/1/environ; echo '--stat--'; "
                          "stat -c '%%a %%U' %s" % TOKEN_PATH], 30, check_rc=False)
        check(rc == 0 and "--env--" in out and "--stat--" in out,
              "node%d: cannot read PID 1's command line and environment (exit %d): %s" %
              (n, rc, out))
        argv, rest = out.split("--env--\n", 1)
        environ, mode_owner = rest.split("--stat--\n", 1)
        check_node_token(n, argv.splitlines(), environ.splitlines(), mode_owner.strip())
    log("each node's PID 1 is tierkvd with TIERKV_PEER_TOKEN_FILE=%s (mode 0600, owner tierkv), "
        "made by the image's entrypoint (TIERKV_PEER_TOKEN_GENERATE)" % TOKEN_PATH)
    check_image_refuses(image)
    rc, out, _ = run(["docker", "run", "--rm", "--entrypoint", "/bin/sh", image, "-c",
                      "ls -A /var/lib/tierkv-secrets"], 60, check_rc=False)
    check(rc == 0 and out.strip() == "", "the image holds secrets: %r (exit %d)" % (out, rc))
    leader = wait_until("an agreed leader", 30, lambda: leader_of(port_of, (1, 2, 3)))
    term = cluster(port_of[leader]).get("term")
    victim = 3 if leader != 3 else 2
    nets = json.loads(dep.inspect(victim, "{{json .NetworkSettings.Networks}}"))
    net_name, net_info = next(iter(nets.items()))
    before = metric(port_of[leader], "tierkv_transport_auth_failures_total") or 0.0
    impostor = "%s-impostor" % dep.project
    members = ",".join("%d=node%d:7000" % (n, n) for n in (1, 2, 3))
    run(["docker", "network", "disconnect", net_name, dep.container(victim)], 60)
    try:
        run(["docker", "run", "-d", "--name", impostor, "--network", net_name,
             "--network-alias", "node%d" % victim,
             "--entrypoint", "/bin/sh", image, "-c",
             "umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /tmp/t; "
             "exec tierkvd --id %d --members %s --listen-raft 0.0.0.0:7000 "
             "--listen-http 127.0.0.1:8080 --store mem "
             "--peer-token-file /tmp/t" % (victim, members)], 60)
        wait_until("the leader refusing the impostor's proof (/metrics)", 30,
                   lambda: (metric(port_of[leader], "tierkv_transport_auth_failures_total")
                            or 0.0) > before)
        _, logs, errs = run(["docker", "logs", impostor], 30, check_rc=False)
        # Refused for its proof, or first for its data directory (the HELLO's
        # incarnation, checked before the proof): either way it is out.
        check("cluster token proof" in logs + errs or "refused this node" in logs + errs,
              "the impostor's log does not say why it was refused:\n%s"
              % (logs + errs)[-2000:])
        others = [n for n in (1, 2, 3) if n != victim]
        check(leader_of(port_of, others) == leader, "the leader changed under the impostor")
        check(cluster(port_of[leader]).get("term") == term,
              "the term moved under the impostor (%s -> %s)"
              % (term, cluster(port_of[leader]).get("term")))
    finally:
        run(["docker", "rm", "-f", impostor], 60, check_rc=False)
        run(["docker", "network", "connect", "--alias", "node%d" % victim, net_name,
             dep.container(victim)], 60, check_rc=False)
    wait_until("node%d back" % victim, 60, lambda: ready(port_of[victim]))
    log("peer token on every node (the same, made on first up, not in the image); an "
        "impostor with another token at node%d's address and id was refused by the leader "
        "node%d (auth failures %d -> %d), which kept its term %s" %
        (victim, leader, before, metric(port_of[leader], "tierkv_transport_auth_failures_total"),
         term))


def self_test():
    """The checkers must be able to fail: known-bad cases, no Docker needed."""
    global NOT_LEADER_GRACE_S
    good = [("k/a", "1", 1, 5, 5), ("k/b", "2", 1, 6, 6)]
    views = {1: good, 2: list(good), 3: list(good)}
    model = {"k/a": "1", "k/b": "2"}
    converge("identical", [1, 2, 3], model, timeout_s=1, scan=lambda p: views[p])
    bad_cases = [
        ("a node lacks a key", {3: good[:1]}, model),
        ("a node has another revision", {2: [good[0], ("k/b", "2", 1, 6, 7)]}, model),
        ("a node has another value", {1: [good[0], ("k/b", "X", 1, 6, 6)]}, model),
        ("an acknowledged write is lost everywhere", {}, dict(model, **{"k/c": "3"})),
    ]
    for name, change, m in bad_cases:
        v = dict(views)
        v.update(change)
        try:
            converge(name, [1, 2, 3], m, timeout_s=1, scan=lambda p, v=v: v[p])
        except Fail as e:
            print("ok: rejected (%s): %s" % (name, e))
            continue
        raise SystemExit("self-test: converge accepted a bad case: " + name)

    # Digests: equal at one applied index passes; a difference at the same
    # index fails at once; indexes that never meet fail at the deadline.
    def digests(table):
        return lambda p: table[p]
    ok = {1: (40, "aa"), 2: (40, "aa"), 3: (40, "aa")}
    if same_digest("identical", [1, 2, 3], timeout_s=1, digest=digests(ok)) != (40, "aa"):
        raise SystemExit("self-test: same_digest returned the wrong level")
    # A lagging node catches up on the second poll: accepted.
    polls = {"n": 0}

    def catching_up(p):
        polls["n"] += 1
        return (39, "ab") if p == 3 and polls["n"] <= 3 else ok[p]
    same_digest("catching up", [1, 2, 3], timeout_s=5, digest=catching_up)
    for name, table, timeout_s in (
            ("same index, another digest", {1: (40, "aa"), 2: (40, "bb"), 3: (40, "aa")}, 30),
            ("indexes never meet", {1: (40, "aa"), 2: (40, "aa"), 3: (41, "aa")}, 1)):
        t = time.monotonic()
        try:
            same_digest(name, [1, 2, 3], timeout_s=timeout_s, digest=digests(table))
        except Fail as e:
            print("ok: rejected (%s) in %.1f s: %s" % (name, time.monotonic() - t, e))
            if timeout_s > 1 and time.monotonic() - t > 5:
                raise SystemExit("self-test: a divergence waited for the deadline")
            continue
        raise SystemExit("self-test: same_digest accepted a bad case: " + name)

    # A follower that never forwards must fail the write phase, quickly.
    import http.server

    class NotLeader(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = b'{"error":{"code":"not_leader","message":"x"}}'
            self.send_response(503)
            self.send_header("X-Tierkv-Leader", "1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    http.server.HTTPServer.protocol_version = "HTTP/1.1"
    srv = http.server.HTTPServer(("127.0.0.1", 0), NotLeader)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    NOT_LEADER_GRACE_S = 1
    try:
        write_keys([srv.server_address[1]], "k/x", 1, {}, deadline_s=20)
    except Fail as e:
        print("ok: rejected (a node that refuses writes with not_leader): %s" % e)
    else:
        raise SystemExit("self-test: a node answering not_leader was accepted")
    finally:
        srv.shutdown()

    # A node's token setup: known-bad command lines, environments and modes.
    good = (["/usr/local/bin/tierkvd"], ["HOME=/var/lib/tierkv",
                                         "TIERKV_PEER_TOKEN_FILE=" + TOKEN_PATH], "600 tierkv")
    check_node_token(1, *good)
    check_node_token(1, ["tierkvd", "--peer-token-file", TOKEN_PATH], [], "600 tierkv")
    for name, argv, environ, mode_owner in (
            ("PID 1 is the shell, not tierkvd", ["/bin/sh", "-c", "x"], good[1], good[2]),
            ("no token file", good[0], ["HOME=/"], good[2]),
            ("an empty TIERKV_PEER_TOKEN_FILE", good[0], ["TIERKV_PEER_TOKEN_FILE="], good[2]),
            ("another token file", ["tierkvd", "--peer-token-file=/tmp/t"], good[1], good[2]),
            ("a token file at 0644", good[0], good[1], "644 tierkv"),
            ("a token file owned by root", good[0], good[1], "600 root")):
        try:
            check_node_token(1, argv, environ, mode_owner)
        except Fail as e:
            print("ok: rejected (%s): %s" % (name, e))
            continue
        raise SystemExit("self-test: check_node_token accepted a bad case: " + name)

    # No engine: a skip (77) with a message, not a failure.
    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent/tierkv-e2e.sock")
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--tierkvd", "/bin/false",
                        "--tierkv", "/bin/false"], env=env, timeout=60, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if p.returncode != SKIP or "SKIP: no Docker engine answers" not in p.stdout:
        raise SystemExit("self-test: without an engine: exit %d, %r" % (p.returncode, p.stdout))
    print("ok: without an engine: exit 77, %s" % p.stdout.strip())
    print("self-test passed")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    ap = argparse.ArgumentParser()
    ap.add_argument("--tierkvd", required=True)
    ap.add_argument("--tierkv", required=True)
    ap.add_argument("--keys", type=int, default=1000, help="keys written through each node")
    ap.add_argument("--keep", action="store_true", help="leave the deployment up")
    ap.add_argument("--project", default="tierkv-e2e")
    ap.add_argument("--image", default="tierkv:e2e")
    ap.add_argument("--follow-leader", action="store_true",
                    help="diagnostics: let writes refused with not_leader go to the leader")
    a = ap.parse_args()
    global FOLLOW_LEADER
    FOLLOW_LEADER = a.follow_leader

    version, why = docker_answers()
    if version is None:
        print("SKIP: no Docker engine answers (%s); the docker end-to-end test needs one"
              % why, flush=True)
        return SKIP
    compose, compose_version = compose_command()
    if compose is None:
        print("SKIP: Docker %s answers but neither `docker compose` nor `docker-compose` "
              "is installed" % version, flush=True)
        return SKIP
    log("docker engine %s, compose: %s (%s)" % (version, " ".join(compose), compose_version))

    # Tear down on SIGTERM/SIGINT too (meson's timeout sends SIGTERM to the
    # process group, then SIGKILL 0.5 s later): a detached `down -v` starts at
    # once, and the handler raises so the finally below cleans up as well if
    # it gets the time.
    deployment = []

    def on_signal(signum, frame):
        STOP.set()
        if deployment:
            deployment[0].down_detached()
        raise Interrupted("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    results = {}
    extra = []  # (kind, name) made outside compose: removed before `down`
    # 1. The image.
    base = os.environ.get("TIERKV_BASE_IMAGE", "debian:12-slim")
    rc, _, _ = run(["docker", "image", "inspect", base], 30, check_rc=False)
    results["base_cached"] = rc == 0
    t = time.monotonic()
    try:
        run([os.path.join(DEPLOY, "build-images.sh"), "--tierkvd", a.tierkvd,
             "--tierkv", a.tierkv, "--tag", a.image, "--base", base], 900, capture=False)
    except Interrupted as e:
        print("FAIL: interrupted by %s while building the image" % e, flush=True)
        return 1
    results["build_s"] = time.monotonic() - t
    results["image_mib"] = int(run(["docker", "image", "inspect", "-f", "{{.Size}}", a.image],
                                   30)[1].strip()) / 2**20
    log("image %s built in %.1f s (base image %s), %.1f MiB" %
        (a.image, results["build_s"], "cached" if results["base_cached"] else "made",
         results["image_mib"]))

    ports = free_ports(3)
    env = dict(os.environ, TIERKV_IMAGE=a.image, TIERKV_BIND="127.0.0.1",
               TIERKV_HTTP_PORT_1=str(ports[0]), TIERKV_HTTP_PORT_2=str(ports[1]),
               TIERKV_HTTP_PORT_3=str(ports[2]), COMPOSE_HTTP_TIMEOUT="120")
    env.pop("COMPOSE_PROJECT_NAME", None)
    dep = Deployment(compose, a.project, env)
    deployment.append(dep)
    port_of = {1: ports[0], 2: ports[1], 3: ports[2]}
    model = {}
    placeholders = []

    failed = None
    try:
        stale = dep.leftovers()
        if stale:
            log("removing leftovers of an earlier run: %s" % stale)
            dep.down()
        t = time.monotonic()
        dep.c("up", "-d", timeout=300)
        log("compose up (ports %s) in %.1f s" % (ports, time.monotonic() - t))
        # Members by service name, no fixed addresses.
        for n in (1, 2, 3):
            envs = json.loads(dep.inspect(n, "{{json .Config.Env}}"))
            check("TIERKV_MEMBERS=1=node1:7000,2=node2:7000,3=node3:7000" in envs,
                  "node%d's members are not the service names: %s" %
                  (n, [e for e in envs if e.startswith("TIERKV_MEMBERS=")]))
            nets = json.loads(dep.inspect(n, "{{json .NetworkSettings.Networks}}"))
            check(all(not (v.get("IPAMConfig") or {}).get("IPv4Address") for v in nets.values()),
                  "node%d has a fixed address: %s" % (n, nets))
        log("members named node1..node3 (DNS), no fixed container addresses")

        # 1. Readiness, health, user, volume.
        t = time.monotonic()
        for n in (1, 2, 3):
            wait_until("node%d /readyz" % n, 90, lambda n=n: ready(port_of[n]))
        log("all three answer /readyz after %.1f s" % (time.monotonic() - t))
        for n in (1, 2, 3):
            wait_until("node%d healthy in Docker" % n, 90,
                       lambda n=n: dep.inspect(n, "{{.State.Health.Status}}") == "healthy",
                       interval_s=1)
        results["ready_s"] = time.monotonic() - t
        log("all three ready and healthy in %.1f s" % results["ready_s"])
        for n in (1, 2, 3):
            rc, out, _ = run(["docker", "exec", dep.container(n), "id", "-u"], 30)
            check(out.strip() not in ("", "0"), "node%d runs as root" % n)
            mounts = json.loads(dep.inspect(n, "{{json .Mounts}}"))
            check(any(m.get("Type") == "volume" and m.get("Destination") == "/var/lib/tierkv"
                      for m in mounts), "node%d: /var/lib/tierkv is not a volume: %s" % (n, mounts))
        log("containers run as uid %s, data in named volumes" % out.strip())
        # The members advertise node1:8080 ...: inside the network, `tierkv
        # status` on one node reaches all three (issue 54).
        for n in (1, 2, 3):
            rc, out = exec_cli(dep, n, ["--json", "status"])
            check(rc == 0, "node%d: tierkv status: exit %d: %s" % (n, rc, out))
            rows = json.loads(out)
            check(len(rows) == 3 and all(r.get("reachable") for r in rows),
                  "node%d: tierkv status does not reach all three: %s" % (n, out))
        log("tierkv status in each container reaches all three nodes (node1..3:8080)")
        check_peer_auth(dep, a.image, port_of)

        # 2. Writes through every node.
        secs, retries = write_keys([port_of[n] for n in (1, 2, 3)], "k/a", a.keys, model)
        log("wrote %d keys through each node (%d in all) in %.1f s, %d retries" %
            (a.keys, 3 * a.keys, secs, retries))
        results["write_ops_s"] = 3 * a.keys / secs

        # 3. Kill the leader, keep writing, restart it, converge.
        leader = wait_until("an agreed leader", 30, lambda: leader_of(port_of, (1, 2, 3)))
        others = [n for n in (1, 2, 3) if n != leader]
        run(["docker", "kill", dep.container(leader)], 60)
        t = time.monotonic()
        log("killed the leader, node%d (SIGKILL)" % leader)
        secs, retries = write_keys([port_of[n] for n in others], "k/b", a.keys // 2, model,
                                   deadline_s=60)
        log("wrote %d keys through node%d and node%d meanwhile in %.1f s, %d retries "
            "(elections included)" % (2 * (a.keys // 2), others[0], others[1], secs, retries))
        new_leader = wait_until("a new leader among the survivors", 30,
                                lambda: leader_of(port_of, others))
        log("node%d leads now" % new_leader)
        state = dep.inspect(leader, "{{.State.Status}}")
        check(state != "running", "node%d was restarted behind the test's back" % leader)
        run(["docker", "start", dep.container(leader)], 120)
        wait_until("restarted node%d /readyz" % leader, 90, lambda: ready(port_of[leader]))
        scan = converge("after restarting node%d" % leader, [port_of[n] for n in (1, 2, 3)],
                        model)
        applied, digest = same_digest("digests after restarting node%d" % leader,
                                      [port_of[n] for n in (1, 2, 3)])
        results["failover_cycle_s"] = time.monotonic() - t
        log("node%d restarted; all three hold the same %d keys (every acknowledged write) "
            "and digest %s at applied index %d" % (leader, len(scan), digest, applied))

        # 4. Partition the current leader away from the others.
        iso = wait_until("an agreed leader", 30, lambda: leader_of(port_of, (1, 2, 3)))
        majority = [n for n in (1, 2, 3) if n != iso]
        nets = json.loads(dep.inspect(iso, "{{json .NetworkSettings.Networks}}"))
        check(len(nets) == 1, "node%d is on %d networks" % (iso, len(nets)))
        net_name, net_info = next(iter(nets.items()))
        ip = net_info["IPAddress"]
        run(["docker", "network", "disconnect", net_name, dep.container(iso)], 60)
        t = time.monotonic()
        log("disconnected node%d (the leader, %s) from %s" % (iso, ip, net_name))
        new_leader = wait_until("the majority electing a leader", 30,
                                lambda: leader_of(port_of, majority))
        results["partition_election_s"] = time.monotonic() - t
        log("majority elected node%d in %.1f s" % (new_leader, results["partition_election_s"]))
        secs, retries = write_keys([port_of[n] for n in majority], "k/c", a.keys // 5, model,
                                   deadline_s=30)
        log("majority took %d writes in %.1f s (%d retries)" %
            (2 * (a.keys // 5), secs, retries))
        # Linearizable reads on the majority see them.
        cl = {n: Client(port_of[n]) for n in majority}
        for key in sorted(k for k in model if k.startswith("k/c/"))[:50]:
            for n in majority:
                st, js = cl[n].json("GET", "/v1/kv/%s?consistency=linearizable" % q(key))
                check(st == 200 and js["value"] == model[key],
                      "linearizable read of %s on node%d: %d %s" % (key, n, st, js))
        for c in cl.values():
            c.close()
        log("majority serves linearizable reads of them")
        # The isolated node: alive (stale reads answer) but refuses
        # linearizable reads and writes.
        probe = sorted(model)[0]
        rc, out = exec_cli(dep, iso, ["--consistency", "stale", "get", probe])
        check(rc == 0 and model[probe] in out,
              "stale read on the isolated node%d: exit %d: %s" % (iso, rc, out))
        for i in range(3):
            rc, out = exec_cli(dep, iso, ["--consistency", "linearizable", "get", probe])
            check(rc in (5, 6), "linearizable read on the isolated node%d should be refused "
                  "(exit 5 or 6), got exit %d: %s" % (iso, rc, out))
        rc2, out2 = exec_cli(dep, iso, ["put", "k/isolated", "x"])
        check(rc2 in (5, 6), "a write on the isolated node%d should be refused, got exit %d: %s"
              % (iso, rc2, out2))
        log("isolated node%d answers stale reads but refuses linearizable reads (%s) "
            "and writes" % (iso, out.splitlines()[-1] if out else "exit %d" % rc))
        # A placeholder takes the freed address if Docker hands out the lowest
        # free one (if it allocates serially, the node gets a new one anyway),
        # so the node comes back elsewhere and is found only by its name.
        placeholder = a.project + "-placeholder"
        run(["docker", "run", "-d", "--rm", "--name", placeholder, "--network", net_name,
             "--entrypoint", "sleep", a.image, "600"], 120)
        placeholders.append(placeholder)
        run(["docker", "network", "connect", "--alias", "node%d" % iso, net_name,
             dep.container(iso)], 60)
        new_ip = json.loads(dep.inspect(iso, "{{json .NetworkSettings.Networks}}"))[
            net_name]["IPAddress"]
        run(["docker", "rm", "-f", placeholder], 60, check_rc=False)
        placeholders.remove(placeholder)
        check(new_ip and new_ip != ip, "node%d came back at its old address %s: the test "
              "would not show that the others find it by name" % (iso, ip))
        log("reconnected node%d as node%d at %s (was %s)" % (iso, iso, new_ip, ip))
        wait_until("reconnected node%d /readyz" % iso, 60, lambda: ready(port_of[iso]))
        scan = converge("after reconnecting node%d" % iso, [port_of[n] for n in (1, 2, 3)],
                        model)
        check(not any(k == "k/isolated" for (k, _, _, _, _) in scan),
              "the write refused by the isolated node was applied")
        applied, digest = same_digest("digests after reconnecting node%d" % iso,
                                      [port_of[n] for n in (1, 2, 3)])
        log("node%d caught up; all three hold the same %d keys and digest %s at applied "
            "index %d" % (iso, len(scan), digest, applied))

        # 5. A follower loses its volume and comes back under its id.
        t = time.monotonic()
        replace_node(a, dep, port_of, model, net_name, extra)
        results["replace_s"] = time.monotonic() - t
    except Fail as e:
        failed = e
    except Interrupted as e:
        failed = Fail("interrupted by %s (a detached `down -v` is running)" % e)
    except Exception as e:  # an unexpected error is a failure too, after cleanup
        failed = Fail("%s: %s" % (type(e).__name__, e))
    finally:
        STOP.set()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for pl in placeholders:
            run(["docker", "rm", "-f", pl], 60, check_rc=False)
        if failed is not None:
            log("FAILED: %s" % failed)
            rc, out, err = dep.c("logs", "--no-color", "--tail", "40", timeout=60,
                                 check_rc=False)
            print(out[-12000:], err[-2000:], flush=True)
        if a.keep and failed is None:
            log("--keep: left the deployment up (project %s)" % a.project)
        else:
            for kind, name in reversed(extra):
                run(["docker", "rm", "-f", "-v", name] if kind == "container" else
                    ["docker", "volume", "rm", "-f", name], 120, check_rc=False)
            secs, left = dep.down()
            log("compose down -v in %.1f s" % secs)
            if left and failed is None:
                failed = Fail("left behind after compose down: %s" % left)

    total = time.monotonic() - T0
    if failed is not None:
        print("FAIL: %s" % failed, flush=True)
        return 1
    summary = {"test": "docker-compose-e2e", "base_cached": results["base_cached"],
               "image_build_s": round(results["build_s"], 1),
               "image_mib": round(results["image_mib"], 1),
               "ready_s": round(results["ready_s"], 1),
               "write_ops_s": round(results["write_ops_s"]),
               "failover_cycle_s": round(results["failover_cycle_s"], 1),
               "partition_election_s": round(results["partition_election_s"], 1),
               "replace_s": round(results["replace_s"], 1),
               "total_s": round(total, 1)}
    print(json.dumps(summary), flush=True)
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
