#!/usr/bin/env python3
"""hiccup.py: how long this machine stops running anything (issue 22).

One process per CPU, pinned to it and, when it may (root), at real-time
priority (SCHED_FIFO 50): it sleeps 2 ms at a time and logs every wake-up that
came more than --min-ms late. A real-time thread that sleeps is run before any
ordinary thread the moment its timer fires, so a gap here is time the guest
did not run at all (the hypervisor held the virtual CPU: "steal") or spent in
the kernel where it cannot be preempted -- never a loop that was busy or
waited for a core behind other threads. bench_scale.py holds the nodes' slow
loop turns against these gaps.

Each gap is one line on stdout:
  gap cpu=N end=UNIX_SECONDS ms=GAP steal_ms=STEAL
where STEAL is that CPU's steal time (from /proc/stat) between the last reading
before the gap (at most 100 ms before it) and its end.

Beside the meters, one ordinary process reads /proc/vmstat every 100 ms and
logs each interval in which a thread of the guest had to reclaim or compact
memory itself before an allocation could go on (a stall inside whatever
system call or fault allocated -- a writev's socket buffers, a page fault):
  vm end=UNIX_SECONDS allocstall=N compact_stall=N pgscan_direct=N
with the counts over that interval (of at most 100 ms, ending at END).

usage: scripts/hiccup.py [--min-ms 10] [--seconds 0 (until killed)]
"""
import argparse, os, signal, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--min-ms", type=float, default=10.0)
ap.add_argument("--seconds", type=float, default=0.0)
o = ap.parse_args()
TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


def steal_ms(cpu):
    """This CPU's steal time so far, in ms (0 if /proc/stat does not say)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu%d " % cpu):
                v = line.split()
                return int(v[8]) * TICK_MS if len(v) > 8 else 0.0
    return 0.0


def meter(cpu):
    os.sched_setaffinity(0, {cpu})
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
        rt = "SCHED_FIFO 50"
    except (PermissionError, OSError):
        rt = "ordinary priority (no permission for SCHED_FIFO)"
    os.write(1, b"hiccup: cpu=%d %s, gaps over %.1f ms\n" % (cpu, rt.encode(), o.min_ms))
    end = time.monotonic() + o.seconds if o.seconds else float("inf")
    last = time.monotonic()
    st_at, st = last, steal_ms(cpu)
    while last < end:
        time.sleep(0.002)
        now = time.monotonic()
        gap = (now - last) * 1000.0 - 2.0
        if gap > o.min_ms:
            s = steal_ms(cpu)
            # One write per line: the meters of all CPUs share stdout.
            os.write(1, b"gap cpu=%d end=%.3f ms=%.1f steal_ms=%.0f\n" % (
                cpu, time.time(), gap, s - st))
            st_at, st = now, s
        elif now - st_at >= 0.1:
            st_at, st = now, steal_ms(cpu)
        last = now


VM_KEYS = ("allocstall", "compact_stall", "pgscan_direct")


def vm_counts():
    """The direct-reclaim and compaction counters, summed over their zones."""
    c = dict.fromkeys(VM_KEYS, 0)
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            for key in VM_KEYS:
                if k == key or (key == "allocstall" and k.startswith("allocstall_")):
                    c[key] += int(v)
    return c


def vm_meter():
    end = time.monotonic() + o.seconds if o.seconds else float("inf")
    last = vm_counts()
    while time.monotonic() < end:
        time.sleep(0.1)
        now = vm_counts()
        d = [now[k] - last[k] for k in VM_KEYS]
        if any(d):
            os.write(1, b"vm end=%.3f allocstall=%d compact_stall=%d pgscan_direct=%d\n" % (
                time.time(), d[0], d[1], d[2]))
        last = now


pids = []
for cpu in sorted(os.sched_getaffinity(0)) + [None]:
    pid = os.fork()
    if pid == 0:
        try:
            meter(cpu) if cpu is not None else vm_meter()
        except KeyboardInterrupt:
            pass
        os._exit(0)
    pids.append(pid)


def stop(*_):
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
for p in pids:
    os.waitpid(p, 0)
