#!/usr/bin/env python3
"""etcd's v3 API on tierkvd (--listen-client, etcdapi/) with etcd's own Go
client: a 3-node cluster, each node with --listen-client; etcd-client
(main.go, built by run.sh) runs its functional checks through the leader and
a follower, then its hostile peers against the leader. After each, every
node's /healthz answers, the cluster keeps its leader, and the leader's
memory grew by less than RSS_GROWTH_MAX; at the end every node stops
cleanly (exit 0).

    etcd_test.py TIERKVD ETCD_CLIENT [--against-http]

--against-http is the known-bad control (registered should_fail): the client
is pointed at the nodes' HTTP/1.1 ports, which are no etcd server, and must
fail its first check; the script then exits 1.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "integration"))
import tkcluster as tk  # noqa: E402

# The hostile peers hold at most a few connections of 8 MiB of output and
# 8 MiB of input each (grpc.c's out_max, conn_in_max); the leader grew by
# 0-62 MiB over runs (glibc keeps what it freed) before the streaming
# checks, 106-165 MiB since (growth is counted from the cluster's start:
# the functional mode's 24 MiB of 1 MiB values for the compacted watch fill
# the change log, about 50 MiB of it; a never-reading watcher holds its 4 MiB
# stream bound). Without the output bounds the never-reading clients alone
# would queue answers by the GiB: 512 MiB (3x the most seen) tells the two
# apart. Sanitizer builds do not run this test (ASan's allocator keeps far
# more: 391-519 MiB in one run of it, with every node stopping cleanly).
RSS_GROWTH_MAX = 512 << 20


def rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def healthy(cluster, leader):
    for nd in cluster.nodes:
        tk.check(nd.alive(), "node %d died" % nd.id)
        st, _, _ = tk.request(nd.http_port, "GET", "/healthz")
        tk.check(st == 200, "node %d: /healthz answered %d" % (nd.id, st))
    now = cluster.wait_leader(timeout=15)
    tk.check(now == leader, "the leader changed from %d to %d" % (leader, now))


def main():
    binary, client = sys.argv[1], sys.argv[2]
    # meson sets MALLOC_PERTURB_ for every test: glibc then fills each block
    # it hands out and takes back, which touches freed heap and puts it in
    # RSS (the leader measured 240-350 MiB over its start with it, 27 MiB
    # without; heaptrack gave a 43 MiB peak heap for the same run). The
    # nodes run without it, as tests/adversary's do: the check is of the
    # node's memory, not of the debugging aid's.
    os.environ.pop("MALLOC_PERTURB_", None)
    # A 1-2 s election timeout (100 ticks of 10 ms): the hostile client runs
    # flat out on the same 2 cores as the three nodes, and the leader's loop
    # thread then waits for a CPU (an ASan build's turns were 100-150 ms long
    # with 8-19 ms of CPU each) past the default 200-400 ms; the check is of
    # what the node does, not of the machine's scheduler.
    cluster = tk.Cluster(binary, n=3, election_ticks=100)
    cports = tk.free_ports(3)
    for nd, p in zip(cluster.nodes, cports):
        nd.args += ["--listen-client", "127.0.0.1:%d" % p]
        nd.client_port = p
    cluster.start()
    failed = 0
    try:
        leader = cluster.wait_leader(timeout=20)
        lnd = cluster.node(leader)
        fnd = [nd for nd in cluster.nodes if nd.id != leader][0]
        ep = lambda nd: "127.0.0.1:%d" % nd.client_port  # noqa: E731
        base = rss(lnd.proc.pid)
        if "--against-http" in sys.argv:
            r = subprocess.run([client, "-mode", "functional", "-leader",
                                "127.0.0.1:%d" % lnd.http_port, "-follower",
                                "127.0.0.1:%d" % fnd.http_port], timeout=240)
            print("the client against the HTTP ports exited %d" % r.returncode, flush=True)
            cluster.stop()
            sys.exit(1 if r.returncode != 0 else 0)
        for args in (["-mode", "functional", "-leader", ep(lnd), "-follower", ep(fnd)],
                     ["-mode", "hostile", "-target", ep(lnd)]):
            r = subprocess.run([client] + args, timeout=240)
            tk.check(r.returncode == 0, "etcd-client %s failed (%d)" % (args[1], r.returncode))
            healthy(cluster, leader)
            grown = rss(lnd.proc.pid) - base
            print("ok   %s: nodes healthy, leader %d kept, leader RSS grew %d MiB"
                  % (args[1], leader, grown >> 20), flush=True)
            tk.check(grown < RSS_GROWTH_MAX, "the leader's RSS grew by %d MiB" % (grown >> 20))
        tk.check_graceful_stop(cluster)
        print("ok   every node stopped cleanly", flush=True)
    except Exception as e:  # report, then the logs
        failed = 1
        print("FAIL %s: %s" % (type(e).__name__, e), flush=True)
    tk.finish(cluster, failed)


if __name__ == "__main__":
    main()
