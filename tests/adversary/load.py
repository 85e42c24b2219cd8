"""Clients for the adversarial suite: the normal client (a keep-alive HTTP
client writing and reading at a steady rate, recording latencies and the
writes it was answered 200 for) and small socket tools the hazards share.

Each runs in a process of its own (multiprocessing, fork), so that a hazard's
Python never delays the normal client's (no shared GIL)."""
import http.client
import os
import random
import select
import selectors
import socket
import ssl
import time


def tls_client_ctx(ca_file):
    if not ca_file:
        return None
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.check_hostname = False  # the certificate names 127.0.0.1 and localhost
    return ctx


def connect(port, ctx, timeout=10):
    if ctx is None:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    return http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=ctx)


def request(port, ctx, method, path, body=None, headers=None, timeout=10):
    """One request on a fresh connection: (status, body bytes)."""
    c = connect(port, ctx, timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


class KeepAlive:
    """One keep-alive connection that reconnects after an error."""

    def __init__(self, port, ctx, timeout=10):
        self.port, self.ctx, self.timeout = port, ctx, timeout
        self.c = None
        self.reconnects = 0

    def do(self, method, path, body=None, headers=None):
        """(status, body); status 0 when the request failed (then the
        connection is dropped and the next call reconnects)."""
        try:
            if self.c is None:
                self.c = connect(self.port, self.ctx, self.timeout)
                self.reconnects += 1
            self.c.request(method, path, body=body, headers=headers or {})
            r = self.c.getresponse()
            data = r.read()
            if r.will_close:
                self.close()
            return r.status, data
        except (OSError, http.client.HTTPException) as e:
            self.close()
            return 0, str(e).encode()

    def close(self):
        if self.c is not None:
            self.c.close()
            self.c = None


def normal_client(ports, leader_port, ca_file, rate_hz, stop_ev, out):
    """Until stop_ev: every 1/rate_hz s one request, alternating a PUT of a
    new key norm/<seq> on the leader and a linearizable GET of the last
    acknowledged key on each node in turn. Sends to `out` (a Pipe end):
    {"records": [(t_start_monotonic, latency_s, kind ("put", "get@PORT"), status)],
     "acked": {key: value}, "reconnects": n}."""
    ctx = tls_client_ctx(ca_file)
    lead = KeepAlive(leader_port, ctx)
    conns = [KeepAlive(p, ctx) for p in ports]
    records, acked = [], {}
    tok = "%08x" % random.getrandbits(32)
    seq = 0
    last_key = None
    period = 1.0 / rate_hz
    t_next = time.monotonic()
    i = 0
    while not stop_ev.is_set():
        now = time.monotonic()
        if now < t_next:
            time.sleep(min(t_next - now, 0.05))
            continue
        t_next += period
        if t_next < now - 1.0:  # far behind (a stall): do not burst to catch up
            t_next = now + period
        t0 = time.monotonic()
        if i % 2 == 0 or last_key is None:
            seq += 1
            key = "norm/%07d" % seq
            val = "v%d-%s" % (seq, tok)
            st, _ = lead.do("PUT", "/v1/kv/" + key, val.encode())
            dt = time.monotonic() - t0
            if st == 200:
                acked[key] = val
                last_key = key
            records.append((t0, dt, "put", st))
        else:
            c = conns[(i // 2) % len(conns)]
            st, _ = c.do("GET", "/v1/kv/%s?consistency=linearizable&raw" % last_key)
            records.append((t0, time.monotonic() - t0, "get@%d" % c.port, st))
        i += 1
    lead.close()
    for c in conns:
        c.close()
    out.send({"records": records, "acked": acked,
              "reconnects": lead.reconnects + sum(c.reconnects for c in conns)})
    out.close()


class Resp:
    """An incremental reader of HTTP/1.1 responses (Content-Length or
    chunked) that keeps no body bytes: feed() returns the statuses of the
    responses completed by the bytes given."""

    def __init__(self):
        self.head = b""
        self.left = None  # body bytes still to come; -1: chunked
        self.tail = b""
        self.status = 0

    def feed(self, data):
        done = []
        while data:
            if self.left is None:
                self.head += data
                end = self.head.find(b"\r\n\r\n")
                if end < 0:
                    return done
                head, data = self.head[:end], self.head[end + 4:]
                self.head = b""
                lines = head.split(b"\r\n")
                self.status = int(lines[0][9:12])
                self.left = 0
                for ln in lines[1:]:
                    k, _, v = ln.partition(b":")
                    k = k.strip().lower()
                    if k == b"content-length":
                        self.left = int(v.strip())
                    elif k == b"transfer-encoding":
                        self.left = -1
                        self.tail = b""
                if self.left == 0:
                    done.append(self.status)
                    self.left = None
                continue
            if self.left == -1:  # chunked: ends with the zero chunk
                self.tail = (self.tail + data[-16:])[-16:]
                if self.tail.endswith(b"\r\n0\r\n\r\n") or self.tail == b"0\r\n\r\n":
                    done.append(self.status)
                    self.left = None
                return done
            n = min(self.left, len(data))
            self.left -= n
            data = data[n:]
            if self.left == 0:
                done.append(self.status)
                self.left = None
        return done


def request_loop(port, nconns, make_request, depth, stop_ev, stats, rcvbuf=None):
    """nconns connections to port, each keeping `depth` requests in flight
    (make_request(i) gives request i's bytes), reading every answer whole and
    sending the next; a closed connection is reopened. Updates stats:
    status counts ("s200", ...), "bytes", "reopens"."""
    sel = selectors.DefaultSelector()
    buf = bytearray(1 << 18)
    seq = [0]

    def open_one():
        s = socket.socket()
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            for _ in range(depth):
                seq[0] += 1
                s.sendall(make_request(seq[0]))
        except OSError:
            s.close()
            stats["connect_errors"] = stats.get("connect_errors", 0) + 1
            return False
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, Resp())
        return True

    for _ in range(nconns):
        if stop_ev.is_set():
            break
        open_one()
    while not stop_ev.is_set():
        if len(sel.get_map()) < nconns:
            open_one()
        for key, _ in sel.select(timeout=0.1):
            s = key.fileobj
            try:
                n = s.recv_into(buf)
            except BlockingIOError:
                continue
            except OSError:
                n = 0
            if n == 0:
                sel.unregister(s)
                s.close()
                stats["reopens"] = stats.get("reopens", 0) + 1
                continue
            stats["bytes"] = stats.get("bytes", 0) + n
            for st in key.data.feed(bytes(buf[:n])):
                k = "s%d" % st
                stats[k] = stats.get(k, 0) + 1
                seq[0] += 1
                try:
                    s.setblocking(True)
                    s.settimeout(5)
                    s.sendall(make_request(seq[0]))
                    s.setblocking(False)
                except OSError:
                    pass  # seen as a close on the next read
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    sel.close()


def hold_sockets(port, n, first_bytes, stop_ev, stats, recheck_s=1.0, read=False):
    """n connections to port that send first_bytes(i) (or nothing) and never
    read; every recheck_s the ones the server closed (POLLRDHUP) are
    reopened. Updates stats: "opened", "reopened", "connect_errors", "open"."""
    socks = {}
    p = select.poll()
    ev = select.POLLRDHUP | select.POLLHUP | select.POLLERR

    def open_one(i):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            b = first_bytes(i) if first_bytes else b""
            if b:
                s.sendall(b)
        except OSError:
            s.close()
            stats["connect_errors"] = stats.get("connect_errors", 0) + 1
            return None
        socks[s.fileno()] = (i, s)
        p.register(s.fileno(), ev)
        stats["opened"] = stats.get("opened", 0) + 1
        return s

    for i in range(n):
        if stop_ev.is_set():
            break
        open_one(i)
    stats["open"] = len(socks)
    while not stop_ev.is_set():
        stop_ev.wait(recheck_s)
        if stop_ev.is_set():
            break
        closed = [fd for fd, e in p.poll(0) if e & ev]
        for fd in closed:
            i, s = socks.pop(fd)
            p.unregister(fd)
            s.close()
        for fd in closed:
            if stop_ev.is_set():
                break
            if open_one(socks and len(socks) or 0) is not None:
                stats["reopened"] = stats.get("reopened", 0) + 1
        stats["open"] = len(socks)
    stats["open_at_end"] = len(socks)
    for _, s in socks.values():
        s.close()


def raise_nofile():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def nice(n):
    try:
        os.nice(n)
    except OSError:
        pass
