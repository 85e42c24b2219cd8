// The streaming half of etcd-client: Watch and LeaseKeepAlive through
// clientv3 and its concurrency package, and hostile peers on streams.
// Called from main.go's functional and hostile modes.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"golang.org/x/net/http2"
)

type wantEv struct {
	typ mvccpb.Event_EventType
	key string
	rev int64
}

// Reads events from wc until `want` are seen (in order, nothing else), for
// up to 10 s. A wanted revision of -1: any.
func expectEvents(what string, wc clientv3.WatchChan, want []wantEv) []*clientv3.Event {
	var got []*clientv3.Event
	timeout := time.After(10 * time.Second)
	for len(got) < len(want) {
		select {
		case wr, open := <-wc:
			if !open {
				fail("%s: the watch closed after %d events", what, len(got))
			}
			if err := wr.Err(); err != nil {
				fail("%s: %v", what, err)
			}
			got = append(got, wr.Events...)
		case <-timeout:
			fail("%s: %d of %d events in 10 s", what, len(got), len(want))
		}
	}
	if len(got) != len(want) {
		fail("%s: %d events, want %d", what, len(got), len(want))
	}
	for i, w := range want {
		e := got[i]
		if e.Type != w.typ || string(e.Kv.Key) != w.key ||
			(w.rev >= 0 && e.Kv.ModRevision != w.rev) {
			fail("%s: event %d is %v %q at %d, want %v %q at %d", what, i, e.Type,
				e.Kv.Key, e.Kv.ModRevision, w.typ, w.key, w.rev)
		}
	}
	return got
}

func modRev(c context.Context, cl *clientv3.Client, key string) int64 {
	g, err := cl.Get(c, key)
	if err != nil || len(g.Kvs) != 1 {
		fail("Get %s: %v %+v", key, err, g)
	}
	return g.Kvs[0].ModRevision
}

func streams(lc, fc *clientv3.Client) {
	c, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	// Watch a key and a prefix (on a follower, prev_kv on the key's), then
	// put, put, delete through the leader: each sees its events in order at
	// the writes' revisions.
	wctx, wcancel := context.WithCancel(c)
	wk := fc.Watch(wctx, "/w/k", clientv3.WithPrevKV())
	wp := fc.Watch(wctx, "/w/", clientv3.WithPrefix())
	// The watches are created once a write after them is seen by both.
	if _, err := lc.Put(c, "/w/start", "s"); err != nil {
		fail("Put: %v", err)
	}
	expectEvents("prefix watch: the first put", wp,
		[]wantEv{{mvccpb.PUT, "/w/start", modRev(c, lc, "/w/start")}})
	if _, err := lc.Put(c, "/w/k", "1"); err != nil {
		fail("Put: %v", err)
	}
	r1 := modRev(c, lc, "/w/k")
	if _, err := lc.Put(c, "/w/o", "2"); err != nil {
		fail("Put: %v", err)
	}
	r2 := modRev(c, lc, "/w/o")
	dr, err := lc.Delete(c, "/w/k")
	if err != nil || dr.Deleted != 1 {
		fail("Delete: %v %+v", err, dr)
	}
	// The key's watch: the put, then the delete (prev_kv: the put's value).
	ek := expectEvents("key watch", wk, []wantEv{{mvccpb.PUT, "/w/k", r1},
		{mvccpb.DELETE, "/w/k", -1}})
	del := ek[1]
	rd := del.Kv.ModRevision
	if rd <= r2 || rd > dr.Header.Revision || del.PrevKv == nil ||
		string(del.PrevKv.Value) != "1" || del.PrevKv.ModRevision != r1 {
		fail("key watch: the delete %+v (prev %+v), want after %d with prev value 1", del.Kv,
			del.PrevKv, r2)
	}
	if ek[0].Kv.Version != 1 || ek[0].Kv.CreateRevision != r1 || string(ek[0].Kv.Value) != "1" {
		fail("key watch: the put %+v", ek[0].Kv)
	}
	expectEvents("prefix watch", wp, []wantEv{{mvccpb.PUT, "/w/k", r1},
		{mvccpb.PUT, "/w/o", r2}, {mvccpb.DELETE, "/w/k", rd}})
	ok("Watch: a key (prev_kv) and a prefix on a follower see put, put, delete in order at revisions %d %d %d",
		r1, r2, rd)

	// History: from r1, through the leader, the same three events.
	hc := lc.Watch(wctx, "/w/", clientv3.WithPrefix(), clientv3.WithRev(r1))
	expectEvents("watch from an old revision", hc, []wantEv{{mvccpb.PUT, "/w/k", r1},
		{mvccpb.PUT, "/w/o", r2}, {mvccpb.DELETE, "/w/k", rd}})
	// Filters: NoPut sees only the delete.
	nc := lc.Watch(wctx, "/w/", clientv3.WithPrefix(), clientv3.WithRev(r1),
		clientv3.WithFilterPut())
	expectEvents("watch with NOPUT", nc, []wantEv{{mvccpb.DELETE, "/w/k", rd}})
	ok("Watch: history replay from revision %d; the NOPUT filter", r1)

	// Cancel: one watch of two on the same stream; the other goes on.
	cctx, ccancel := context.WithCancel(c)
	cw := lc.Watch(cctx, "/w/c")
	kw := lc.Watch(wctx, "/w/c")
	if _, err := lc.Put(c, "/w/c", "1"); err != nil {
		fail("Put: %v", err)
	}
	rc := modRev(c, lc, "/w/c")
	expectEvents("the watch to cancel", cw, []wantEv{{mvccpb.PUT, "/w/c", rc}})
	expectEvents("the watch kept", kw, []wantEv{{mvccpb.PUT, "/w/c", rc}})
	ccancel()
	closed := time.After(10 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-cw:
		case <-closed:
			fail("the canceled watch's channel stayed open for 10 s")
		}
	}
	if _, err := lc.Put(c, "/w/c", "2"); err != nil {
		fail("Put: %v", err)
	}
	expectEvents("the watch kept after the other's cancel", kw,
		[]wantEv{{mvccpb.PUT, "/w/c", modRev(c, lc, "/w/c")}})
	ok("Watch: cancel of one watch; the other on its stream goes on")

	// Progress: RequestProgress answers with a progress notification.
	if err := lc.RequestProgress(wctx); err != nil {
		fail("RequestProgress: %v", err)
	}
	select {
	case wr := <-kw:
		if !wr.IsProgressNotify() || wr.Header.Revision < rc {
			fail("RequestProgress: %+v (want a progress notification)", wr)
		}
	case <-time.After(10 * time.Second):
		fail("RequestProgress: no answer in 10 s")
	}
	ok("Watch: RequestProgress answered")
	wcancel()

	// Compacted: 24 values of 1 MiB push the change log (16 MiB by default)
	// past r1; a watch from r1 gets ErrCompacted with the compact revision.
	big := strings.Repeat("b", 1<<20-64)
	for i := 0; i < 24; i++ {
		if _, err := lc.Put(c, fmt.Sprintf("/w/big/%d", i%4), big); err != nil {
			fail("Put big: %v", err)
		}
	}
	cc := lc.Watch(c, "/w/", clientv3.WithPrefix(), clientv3.WithRev(r1))
	select {
	case wr := <-cc:
		if wr.Err() != rpctypes.ErrCompacted || wr.CompactRevision < r1 {
			fail("watch from a dropped revision: %v, compact revision %d (want ErrCompacted, >= %d)",
				wr.Err(), wr.CompactRevision, r1)
		}
		ok("Watch: from a revision the change log dropped: ErrCompacted, compact revision %d",
			wr.CompactRevision)
	case <-time.After(10 * time.Second):
		fail("watch from a dropped revision: no answer in 10 s")
	}
	for i := 0; i < 4; i++ {
		lc.Delete(c, fmt.Sprintf("/w/big/%d", i))
	}

	// KeepAlive and concurrency.Session: a session of TTL 2 s lives 8 s
	// (its lease kept alive), and its lease is gone after Close.
	s, err := concurrency.NewSession(fc, concurrency.WithTTL(2))
	if err != nil {
		fail("NewSession: %v", err)
	}
	select {
	case <-s.Done():
		fail("the session ended within 8 s (its lease was not kept alive)")
	case <-time.After(8 * time.Second):
	}
	tl, err := lc.TimeToLive(c, s.Lease())
	if err != nil || tl.TTL <= 0 || tl.GrantedTTL != 2 {
		fail("the session's lease after 8 s: %v %+v", err, tl)
	}
	ka, err := lc.KeepAliveOnce(c, s.Lease())
	if err != nil || ka.TTL != 2 || ka.ID != s.Lease() {
		fail("KeepAliveOnce: %v %+v", err, ka)
	}
	if _, err := lc.KeepAliveOnce(c, clientv3.LeaseID(12345)); err != rpctypes.ErrLeaseNotFound {
		fail("KeepAliveOnce of no lease: %v (want ErrLeaseNotFound)", err)
	}
	s.Close()
	if tl, err := lc.TimeToLive(c, s.Lease()); err != nil || tl.TTL != -1 {
		fail("the session's lease after Close: %v %+v", err, tl)
	}
	ok("LeaseKeepAlive: a 2 s session lives 8 s; KeepAliveOnce answers TTL 2, not found for no lease")

	mutex(lc, fc)
	election(lc, fc)
	resumed(lc, fc)

	fragments(lc) // fragment.go
}

// A TCP proxy to target whose connections cut() closes (the listener stays,
// so clients reconnect through it); count() tells the connections accepted.
func proxy(target string) (string, func(), func() int) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail("proxy listen: %v", err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	accepted := 0
	go func() {
		for {
			a, err := l.Accept()
			if err != nil {
				return
			}
			b, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				a.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, a, b)
			accepted++
			mu.Unlock()
			go func() { io.Copy(a, b); a.Close(); b.Close() }()
			go func() { io.Copy(b, a); a.Close(); b.Close() }()
		}
	}()
	return l.Addr().String(), func() {
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			conns = nil
			mu.Unlock()
		}, func() int {
			mu.Lock()
			defer mu.Unlock()
			return accepted
		}
}

// A watch through a proxy whose connection is cut twice while 200 puts go
// on: clientv3 resumes from its last revision, and the watcher sees every
// put once, in order (no gap, no duplicate).
func resumed(lc, fc *clientv3.Client) {
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	addr, cut, count := proxy(fc.Endpoints()[0])
	pc := client(addr)
	defer pc.Close()
	wc := pc.Watch(c, "/w/r/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	select {
	case wr := <-wc:
		if !wr.Created {
			fail("resumed watch: %+v (want created)", wr)
		}
	case <-time.After(10 * time.Second):
		fail("resumed watch: not created in 10 s")
	}
	const n = 200
	go func() {
		for i := 0; i < n; i++ {
			if _, err := lc.Put(c, fmt.Sprintf("/w/r/%03d", i), "v"); err != nil {
				return
			}
			if i == 60 || i == 140 {
				cut()
			}
		}
	}()
	var got []*clientv3.Event
	timeout := time.After(60 * time.Second)
	for len(got) < n {
		select {
		case wr := <-wc:
			if err := wr.Err(); err != nil {
				fail("resumed watch: %v", err)
			}
			got = append(got, wr.Events...)
		case <-timeout:
			fail("resumed watch: %d of %d events in 60 s", len(got), n)
		}
	}
	for i, e := range got {
		if string(e.Kv.Key) != fmt.Sprintf("/w/r/%03d", i) || e.Type != mvccpb.PUT ||
			(i > 0 && e.Kv.ModRevision <= got[i-1].Kv.ModRevision) {
			fail("resumed watch: event %d is %s at %d (a gap or a duplicate)", i, e.Kv.Key,
				e.Kv.ModRevision)
		}
	}
	if len(got) != n {
		fail("resumed watch: %d events, want %d", len(got), n)
	}
	accepted := count()
	if accepted < 2 {
		fail("resumed watch: %d connection(s) through the proxy: the cuts did not reconnect", accepted)
	}
	ok("Watch through a connection cut twice during 200 puts: every put once, in order (%d connections)",
		accepted)
	lc.Delete(c, "/w/r/", clientv3.WithPrefix())
}

// Two sessions' Mutexes on one key: the second Lock waits for the first
// Unlock.
func mutex(lc, fc *clientv3.Client) {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s1, err := concurrency.NewSession(lc, concurrency.WithTTL(10))
	if err != nil {
		fail("NewSession: %v", err)
	}
	defer s1.Close()
	s2, err := concurrency.NewSession(fc, concurrency.WithTTL(10))
	if err != nil {
		fail("NewSession: %v", err)
	}
	defer s2.Close()
	m1 := concurrency.NewMutex(s1, "/w/lock")
	m2 := concurrency.NewMutex(s2, "/w/lock")
	if err := m1.Lock(c); err != nil {
		fail("Mutex 1 Lock: %v", err)
	}
	var mu sync.Mutex
	held2 := false
	done := make(chan error, 1)
	go func() {
		err := m2.Lock(c)
		mu.Lock()
		held2 = true
		mu.Unlock()
		done <- err
	}()
	select {
	case err := <-done:
		fail("Mutex 2 locked while 1 held it: %v", err)
	case <-time.After(2 * time.Second):
	}
	if err := m1.Unlock(c); err != nil {
		fail("Mutex 1 Unlock: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			fail("Mutex 2 Lock: %v", err)
		}
	case <-time.After(10 * time.Second):
		fail("Mutex 2 did not lock within 10 s of the Unlock")
	}
	mu.Lock()
	if !held2 {
		fail("Mutex 2: not held")
	}
	mu.Unlock()
	if err := m2.Unlock(c); err != nil {
		fail("Mutex 2 Unlock: %v", err)
	}
	ok("concurrency.Mutex: the second Lock waits for the first Unlock")
}

// ---- hostile, on streams ------------------------------------------------------

func grpcMsg(m []byte) []byte {
	out := make([]byte, 5+len(m))
	binary.BigEndian.PutUint32(out[1:], uint32(len(m)))
	copy(out[5:], m)
	return out
}

func watchCreate(key, end string) []byte {
	req := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{
		CreateRequest: &pb.WatchCreateRequest{Key: []byte(key), RangeEnd: []byte(end)}}}
	m, _ := req.Marshal()
	return grpcMsg(m)
}

// Is the socket's local end in CLOSE_WAIT (the server closed it) per
// /proc/net/tcp? Read without touching the socket.
func closeWait(conn net.Conn) bool {
	port := conn.LocalAddr().(*net.TCPAddr).Port
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	want := fmt.Sprintf(":%04X ", port)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 3 && strings.HasSuffix(fs[1]+" ", want) && fs[3] == "08" {
			return true
		}
	}
	return false
}

func hostileStreams(target string) {
	lc := client(target)
	defer lc.Close()
	c, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()

	// 1. 500 watches on one clientv3 stream: all created, the one written
	// to sees its event.
	wctx, wcancel := context.WithCancel(c)
	var chans []clientv3.WatchChan
	for i := 0; i < 500; i++ {
		chans = append(chans, lc.Watch(wctx, fmt.Sprintf("/h/w/%d", i), clientv3.WithCreatedNotify()))
	}
	for i, ch := range chans {
		select {
		case wr := <-ch:
			if !wr.Created || wr.Err() != nil {
				fail("watch %d of 500: %+v %v", i, wr, wr.Err())
			}
		case <-time.After(20 * time.Second):
			fail("watch %d of 500: not created in 20 s", i)
		}
	}
	if _, err := lc.Put(c, "/h/w/250", "x"); err != nil {
		fail("Put: %v", err)
	}
	expectEvents("watch 250 of 500", chans[250], []wantEv{{mvccpb.PUT, "/h/w/250",
		modRev(c, lc, "/h/w/250")}})
	wcancel()
	ok("500 watches on one stream: all created; the one written to sees its event")

	// 2. 500 raw Watch streams on one connection: past 128 refused, the
	// connection and the node go on.
	conn, fr := h2conn(target)
	msg := watchCreate("/h/raw", "")
	for i := 0; i < 500; i++ {
		id := uint32(2*i + 1)
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: headerBlock(
			"/etcdserverpb.Watch/Watch"), EndHeaders: true})
		fr.WriteData(id, false, msg)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	refused, created := 0, 0
	for refused == 0 || created == 0 {
		f, err := fr.ReadFrame()
		if err != nil {
			break
		}
		if rs, ok := f.(*http2.RSTStreamFrame); ok && rs.ErrCode != http2.ErrCodeNo {
			refused++
		}
		if _, ok := f.(*http2.DataFrame); ok {
			created++
		}
	}
	conn.Close()
	if refused == 0 || created == 0 {
		fail("500 raw watch streams: %d refused, %d answered (want some of each)", refused, created)
	}
	ok("500 raw Watch streams on one connection: past the limit refused, the rest answered")

	// 3. Garbage on streams: a Watch and a KeepAlive message that is no
	// protobuf: InvalidArgument (3), the connection usable after.
	conn, fr = h2conn(target)
	for i, path := range []string{"/etcdserverpb.Watch/Watch", "/etcdserverpb.Lease/LeaseKeepAlive"} {
		id := uint32(2*i + 1)
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: headerBlock(path),
			EndHeaders: true})
		fr.WriteData(id, false, grpcMsg([]byte{0xff, 0xff, 0xff, 0xff, 0x0f, 0x12}))
		if s := grpcStatus(conn, fr, id); s != "3" {
			fail("garbage on %s: grpc-status %q, want 3", path, s)
		}
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: headerBlock(
		"/etcdserverpb.KV/Range"), EndHeaders: true})
	fr.WriteData(5, true, rangeMsg("/h/x", ""))
	if s := grpcStatus(conn, fr, 5); s != "0" {
		fail("Range after the garbage streams: grpc-status %q", s)
	}
	conn.Close()
	ok("garbage on a Watch and a KeepAlive stream: InvalidArgument; the connection goes on")

	// 4. A watcher that never reads (and never opens its HTTP/2 window)
	// while a writer writes 12 MiB (3x its stream's bound) to what it
	// watches: the server queues at most its bounds for it (the rest waits
	// in the change log), cuts the
	// stream once it took nothing for 10 s (its queue dropped), and closes
	// the connection once its output made no progress for 30 s: the socket
	// goes to CLOSE_WAIT, seen without reading it. Or, had nothing of a
	// message been begun, the cut's RESOURCE_EXHAUSTED arrives. Others are
	// served meanwhile; etcd_test.py checks the node's memory after.
	conn, fr = h2conn(target)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: headerBlock(
		"/etcdserverpb.Watch/Watch"), EndHeaders: true})
	fr.WriteData(1, false, watchCreate("/h/nr/", "/h/nr0"))
	val := strings.Repeat("n", 128<<10)
	start := time.Now()
	for i := 0; i < 96; i++ {
		if _, err := lc.Put(c, fmt.Sprintf("/h/nr/%d", i%8), val); err != nil {
			fail("Put beside the never-reading watcher: %v", err)
		}
	}
	if _, err := lc.Get(c, "/h/nr/0"); err != nil {
		fail("Get beside the never-reading watcher: %v", err)
	}
	how := ""
	for time.Since(start) < 90*time.Second && how == "" {
		if closeWait(conn) {
			how = "its connection closed"
		}
		time.Sleep(500 * time.Millisecond)
	}
	if how == "" { // read: the cut's status, or the end of the connection
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		for how == "" {
			f, err := fr.ReadFrame()
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					break
				}
				how = "its connection closed (read)"
			}
			if mh, ok := f.(*http2.MetaHeadersFrame); ok && mh.StreamID == 1 {
				for _, hf := range mh.Fields {
					if hf.Name == "grpc-status" && hf.Value == "8" {
						how = "its stream ended RESOURCE_EXHAUSTED"
					}
				}
			}
		}
	}
	conn.Close()
	if how == "" {
		fail("the never-reading watcher was not cut within 90 s")
	}
	ok("a watcher that never reads: 12 MiB written past it; %s after %.0f s", how,
		time.Since(start).Seconds())
	for i := 0; i < 8; i++ {
		lc.Delete(c, fmt.Sprintf("/h/nr/%d", i))
	}
}

// An Election: the first campaigner leads, Observe sees it, a second
// campaign waits until the first resigns, then leads.
func election(lc, fc *clientv3.Client) {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s1, err := concurrency.NewSession(lc, concurrency.WithTTL(10))
	if err != nil {
		fail("NewSession: %v", err)
	}
	defer s1.Close()
	s2, err := concurrency.NewSession(fc, concurrency.WithTTL(10))
	if err != nil {
		fail("NewSession: %v", err)
	}
	defer s2.Close()
	e1 := concurrency.NewElection(s1, "/w/elect")
	e2 := concurrency.NewElection(s2, "/w/elect")
	if err := e1.Campaign(c, "one"); err != nil {
		fail("Campaign 1: %v", err)
	}
	octx, ocancel := context.WithCancel(c)
	defer ocancel()
	obs := e2.Observe(octx)
	select {
	case r := <-obs:
		if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "one" {
			fail("Observe: %+v, want one", r)
		}
	case <-time.After(10 * time.Second):
		fail("Observe: nothing in 10 s")
	}
	done := make(chan error, 1)
	go func() { done <- e2.Campaign(c, "two") }()
	select {
	case err := <-done:
		fail("Campaign 2 won while 1 led: %v", err)
	case <-time.After(2 * time.Second):
	}
	if err := e1.Resign(c); err != nil {
		fail("Resign 1: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			fail("Campaign 2: %v", err)
		}
	case <-time.After(10 * time.Second):
		fail("Campaign 2 did not win within 10 s of the Resign")
	}
	timeout := time.After(10 * time.Second)
	for seen := false; !seen; {
		select {
		case r := <-obs:
			seen = len(r.Kvs) == 1 && string(r.Kvs[0].Value) == "two"
		case <-timeout:
			fail("Observe: the second leader not seen in 10 s")
		}
	}
	if l, err := e1.Leader(c); err != nil || string(l.Kvs[0].Value) != "two" {
		fail("Leader: %v %+v", err, l)
	}
	if err := e2.Resign(c); err != nil {
		fail("Resign 2: %v", err)
	}
	ok("concurrency.Election: campaign, observe, a second campaign waits for the resign, then leads")
}
