// etcd-client: etcd's own Go client (go.etcd.io/etcd/client/v3 v3.6.16)
// against tierkvd's --listen-client (etcdapi/), and hostile HTTP/2 peers
// against the same port. Run by etcd_test.py, which starts the cluster and
// checks the nodes' health after each mode.
//
//	etcd-client -mode functional -leader HOST:PORT -follower HOST:PORT
//	etcd-client -mode hostile -target HOST:PORT
//
// Prints one line per check; exits 1 on the first failure.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func fail(format string, a ...any) {
	fmt.Printf("FAIL "+format+"\n", a...)
	os.Exit(1)
}

func ok(format string, a ...any) {
	fmt.Printf("ok   "+format+"\n", a...)
}

func client(ep string) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{ep},
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		fail("dial %s: %v", ep, err)
	}
	return c
}

func ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 15*time.Second)
}

// The gRPC code of an error; clientv3 turns etcd's known ones into
// rpctypes.EtcdError values, which keep it.
func codeOf(err error) codes.Code {
	if e, ok := err.(rpctypes.EtcdError); ok {
		return e.Code()
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return codes.Unknown
}

// The header every answer carries: this cluster and member, a revision at
// least `minRev`, a term.
func checkHeader(what string, h *pb.ResponseHeader, member uint64, minRev int64) {
	if h == nil || h.ClusterId == 0 || h.MemberId == 0 || h.RaftTerm == 0 {
		fail("%s: header %+v lacks cluster, member or term", what, h)
	}
	if member != 0 && h.MemberId != member {
		fail("%s: header member %d, want %d", what, h.MemberId, member)
	}
	if h.Revision < minRev {
		fail("%s: header revision %d < %d", what, h.Revision, minRev)
	}
}

func functional(leaderEp, followerEp string) {
	lc, fc := client(leaderEp), client(followerEp)
	defer lc.Close()
	defer fc.Close()
	c, cancel := ctx()
	defer cancel()

	st, err := lc.Status(c, leaderEp)
	if err != nil {
		fail("Status on the leader: %v", err)
	}
	checkHeader("Status", st.Header, 0, 1)
	if st.Leader != st.Header.MemberId || st.RaftTerm == 0 || st.Version == "" {
		fail("Status: leader %d member %d term %d version %q", st.Leader,
			st.Header.MemberId, st.RaftTerm, st.Version)
	}
	leaderID := st.Header.MemberId
	fst, err := fc.Status(c, followerEp)
	if err != nil || fst.Leader != leaderID || fst.Header.MemberId == leaderID {
		fail("Status on the follower: %v %+v", err, fst)
	}
	if fst.Header.ClusterId != st.Header.ClusterId {
		fail("cluster ids differ: %d %d", fst.Header.ClusterId, st.Header.ClusterId)
	}
	ok("Status: leader %d, term %d, version %s", st.Leader, st.RaftTerm, st.Version)

	ml, err := fc.MemberList(c)
	if err != nil || len(ml.Members) != 3 {
		fail("MemberList: %v %+v", err, ml)
	}
	checkHeader("MemberList", ml.Header, fst.Header.MemberId, 1)
	ok("MemberList: 3 members")
	// Every member's client URL, as each node announced it (within a few
	// seconds of a leader): clientv3's endpoint sync reads them.
	var urls []string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ml, err = lc.MemberList(c)
		urls = urls[:0]
		for i := 0; err == nil && i < len(ml.Members); i++ {
			if m := ml.Members[i]; len(m.ClientURLs) == 1 {
				urls = append(urls, m.ClientURLs[0])
			}
		}
		if err == nil && len(urls) == 3 {
			break
		}
		if time.Now().After(deadline) {
			fail("MemberList's client URLs after 15 s: %v %v", err, urls)
		}
	}
	for _, ep := range []string{leaderEp, followerEp} {
		found := false
		for _, u := range urls {
			found = found || u == "http://"+ep
		}
		if !found {
			fail("MemberList's client URLs %v lack http://%s", urls, ep)
		}
	}
	ok("MemberList: every member's client URL %v", urls)

	// Put through the follower (forwarded to the leader) and the leader.
	p1, err := fc.Put(c, "/etcd-test/a", "1")
	if err != nil {
		fail("Put via follower: %v", err)
	}
	checkHeader("Put", p1.Header, fst.Header.MemberId, 1)
	p2, err := lc.Put(c, "/etcd-test/b", "2")
	if err != nil {
		fail("Put via leader: %v", err)
	}
	if p2.Header.Revision <= p1.Header.Revision {
		fail("revisions do not grow: %d then %d", p1.Header.Revision, p2.Header.Revision)
	}
	p3, err := lc.Put(c, "/etcd-test/a", "11")
	if err != nil {
		fail("second Put: %v", err)
	}
	ok("Put: revisions %d < %d < %d", p1.Header.Revision, p2.Header.Revision,
		p3.Header.Revision)

	// Linearizable Get on the follower sees the leader's last write.
	g, err := fc.Get(c, "/etcd-test/a")
	if err != nil || len(g.Kvs) != 1 {
		fail("Get via follower: %v %+v", err, g)
	}
	kv := g.Kvs[0]
	if string(kv.Value) != "11" || kv.Version != 2 || kv.CreateRevision != p1.Header.Revision ||
		kv.ModRevision != p3.Header.Revision || g.Count != 1 || g.More {
		fail("Get: %+v (count %d more %v), want value 11 version 2 create %d mod %d", kv,
			g.Count, g.More, p1.Header.Revision, p3.Header.Revision)
	}
	if g.Header.Revision < p3.Header.Revision {
		fail("Get header revision %d before the write %d", g.Header.Revision,
			p3.Header.Revision)
	}
	ok("Get via follower: value, version, create and mod revision")

	miss, err := lc.Get(c, "/etcd-test/missing")
	if err != nil || len(miss.Kvs) != 0 || miss.Count != 0 {
		fail("Get of a missing key: %v %+v", err, miss)
	}
	ok("Get of a missing key: no kvs, count 0")

	for i := 0; i < 5; i++ {
		if _, err := lc.Put(c, fmt.Sprintf("/etcd-test/p/%d", i), "v"); err != nil {
			fail("Put p/%d: %v", i, err)
		}
	}
	pre, err := fc.Get(c, "/etcd-test/p/", clientv3.WithPrefix())
	if err != nil || len(pre.Kvs) != 5 || pre.Count != 5 || pre.More {
		fail("prefix Get: %v %+v", err, pre)
	}
	for i, kv := range pre.Kvs {
		if string(kv.Key) != fmt.Sprintf("/etcd-test/p/%d", i) {
			fail("prefix Get: key %d is %q", i, kv.Key)
		}
	}
	lim, err := lc.Get(c, "/etcd-test/p/", clientv3.WithPrefix(), clientv3.WithLimit(2))
	if err != nil || len(lim.Kvs) != 2 || lim.Count != 5 || !lim.More {
		fail("prefix Get limit 2: %v %+v", err, lim)
	}
	cnt, err := lc.Get(c, "/etcd-test/p/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || len(cnt.Kvs) != 0 || cnt.Count != 5 {
		fail("count only: %v %+v", err, cnt)
	}
	ko, err := lc.Get(c, "/etcd-test/p/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil || len(ko.Kvs) != 5 || len(ko.Kvs[0].Value) != 0 {
		fail("keys only: %v %+v", err, ko)
	}
	fk, err := lc.Get(c, "/etcd-test/b", clientv3.WithFromKey())
	if err != nil || fk.Count < 1 || string(fk.Kvs[0].Key) != "/etcd-test/b" {
		fail("from key: %v %+v", err, fk)
	}
	rg, err := lc.Get(c, "/etcd-test/p/1", clientv3.WithRange("/etcd-test/p/3"))
	if err != nil || rg.Count != 2 {
		fail("range [p/1, p/3): %v %+v", err, rg)
	}
	mm, err := lc.Get(c, "/etcd-test/", clientv3.WithPrefix(),
		clientv3.WithMinModRev(p3.Header.Revision+1))
	if err != nil || mm.Count != 5 {
		fail("min mod revision: %v count %d", err, mm.Count)
	}
	ok("Range: prefix, limit+more, count only, keys only, from key, range, min mod rev")

	// A historic revision: etcd's compacted error; a future one: its own.
	_, err = lc.Get(c, "/etcd-test/a", clientv3.WithRev(p1.Header.Revision))
	if err != rpctypes.ErrCompacted || codeOf(err) != codes.OutOfRange {
		fail("Get at an old revision: %v (want %v)", err, rpctypes.ErrCompacted)
	}
	_, err = lc.Get(c, "/etcd-test/a", clientv3.WithRev(1<<40))
	if err != rpctypes.ErrFutureRev {
		fail("Get at a future revision: %v", err)
	}
	ok("Range at a revision: compacted / future revision errors")

	// Delete: one key through the follower, then a prefix through the leader.
	d1, err := fc.Delete(c, "/etcd-test/a")
	if err != nil || d1.Deleted != 1 {
		fail("Delete via follower: %v %+v", err, d1)
	}
	checkHeader("Delete", d1.Header, fst.Header.MemberId, p3.Header.Revision+1)
	d0, err := lc.Delete(c, "/etcd-test/a")
	if err != nil || d0.Deleted != 0 {
		fail("Delete of a deleted key: %v %+v", err, d0)
	}
	dp, err := lc.Delete(c, "/etcd-test/p/", clientv3.WithPrefix())
	if err != nil || dp.Deleted != 5 {
		fail("Delete prefix: %v %+v", err, dp)
	}
	after, err := fc.Get(c, "/etcd-test/", clientv3.WithPrefix())
	if err != nil || after.Count != 1 || string(after.Kvs[0].Key) != "/etcd-test/b" {
		fail("after deletes: %v %+v", err, after)
	}
	ok("DeleteRange: one key via follower (1, then 0), a prefix (5)")

	// Txn through the follower: compares on version, value, create and mod
	// revision; puts and single-key deletes in either branch.
	t1, err := fc.Txn(c).If(clientv3.Compare(clientv3.Version("/etcd-test/b"), "=", 1)).
		Then(clientv3.OpPut("/etcd-test/t", "1"), clientv3.OpDelete("/etcd-test/b")).
		Else(clientv3.OpPut("/etcd-test/else", "1")).Commit()
	if err != nil || !t1.Succeeded || len(t1.Responses) != 2 ||
		t1.Responses[0].GetResponsePut() == nil ||
		t1.Responses[1].GetResponseDeleteRange().GetDeleted() != 1 {
		fail("Txn version=1 then put+delete: %v %+v", err, t1)
	}
	checkHeader("Txn", t1.Header, fst.Header.MemberId, dp.Header.Revision+1)
	t2, err := lc.Txn(c).If(clientv3.Compare(clientv3.Value("/etcd-test/t"), "=", "nope")).
		Then(clientv3.OpPut("/etcd-test/x", "1")).
		Else(clientv3.OpPut("/etcd-test/t", "2")).Commit()
	if err != nil || t2.Succeeded || len(t2.Responses) != 1 {
		fail("Txn value=nope else put: %v %+v", err, t2)
	}
	tv, err := fc.Get(c, "/etcd-test/t")
	if err != nil || len(tv.Kvs) != 1 || string(tv.Kvs[0].Value) != "2" ||
		tv.Kvs[0].ModRevision != t2.Header.Revision {
		fail("after the txns: %v %+v", err, tv)
	}
	if x, _ := lc.Get(c, "/etcd-test/x"); x == nil || x.Count != 0 {
		fail("the branch not taken wrote /etcd-test/x")
	}
	for i, want := range []bool{true, false} {
		tl, err := lc.Txn(c).If(clientv3.Compare(clientv3.CreateRevision("/etcd-test/lock"),
			"=", 0)).Then(clientv3.OpPut("/etcd-test/lock", "me")).Commit()
		if err != nil || tl.Succeeded != want {
			fail("create-revision=0 txn %d: %v %+v, want succeeded=%v", i, err, tl, want)
		}
	}
	tm, err := lc.Txn(c).If(clientv3.Compare(clientv3.ModRevision("/etcd-test/t"), "<",
		t2.Header.Revision+1)).Then(clientv3.OpDelete("/etcd-test/t")).Commit()
	if err != nil || !tm.Succeeded || tm.Responses[0].GetResponseDeleteRange().GetDeleted() != 1 {
		fail("mod-revision txn: %v %+v", err, tm)
	}
	// Range ops in a Txn (read once it applied: they see its put), and the
	// first/last by create revision (concurrency's Mutex and Election).
	tr, err := fc.Txn(c).If(clientv3.Compare(clientv3.CreateRevision("/etcd-test/s/b"),
		"=", 0)).Then(clientv3.OpPut("/etcd-test/s/b", "B"),
		clientv3.OpGet("/etcd-test/s/", clientv3.WithPrefix())).Else(
		clientv3.OpGet("/etcd-test/s/b")).Commit()
	if err != nil || !tr.Succeeded || len(tr.Responses) != 2 ||
		tr.Responses[1].GetResponseRange().GetCount() != 1 ||
		string(tr.Responses[1].GetResponseRange().Kvs[0].Value) != "B" {
		fail("Txn put then range: %v %+v", err, tr)
	}
	if _, err := lc.Put(c, "/etcd-test/s/a", "A"); err != nil {
		fail("Put: %v", err)
	}
	te, err := lc.Txn(c).If(clientv3.Compare(clientv3.CreateRevision("/etcd-test/s/b"),
		"=", 0)).Then(clientv3.OpPut("/etcd-test/s/b", "X")).Else(
		clientv3.OpGet("/etcd-test/s/b")).Commit()
	if err != nil || te.Succeeded || len(te.Responses) != 1 ||
		string(te.Responses[0].GetResponseRange().Kvs[0].Value) != "B" {
		fail("Txn else range: %v %+v", err, te)
	}
	for _, tc := range []struct {
		opt  []clientv3.OpOption
		want string
	}{{clientv3.WithFirstCreate(), "/etcd-test/s/b"}, {clientv3.WithLastCreate(), "/etcd-test/s/a"},
		{clientv3.WithFirstRev(), "/etcd-test/s/b"}, {clientv3.WithLastRev(), "/etcd-test/s/a"}} {
		g, err := fc.Get(c, "/etcd-test/s/", append(tc.opt, clientv3.WithPrefix())...)
		if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Key) != tc.want || !g.More {
			fail("Get first/last by revision: %v %+v, want %s", err, g, tc.want)
		}
	}
	_, err = lc.Txn(c).If().Then(clientv3.OpTxn(nil, nil, nil)).Commit()
	if codeOf(err) != codes.Unimplemented {
		fail("Txn with a nested Txn: %v (want Unimplemented)", err)
	}
	ok("Txn: version/value/create/mod compares, both branches, puts and deletes, Range ops (seeing the put); first/last by create and mod revision; a nested Txn Unimplemented")

	// Leases: grant, attach a key, time to live with keys, list, revoke
	// (the key goes with it); etcd's errors for what is gone.
	lg, err := fc.Grant(c, 30)
	if err != nil || lg.ID <= 0 || lg.TTL != 30 {
		fail("Grant via follower: %v %+v", err, lg)
	}
	if _, err := lc.Put(c, "/etcd-test/leased", "x", clientv3.WithLease(lg.ID)); err != nil {
		fail("Put with the lease: %v", err)
	}
	tl, err := fc.TimeToLive(c, lg.ID, clientv3.WithAttachedKeys())
	if err != nil || tl.TTL <= 0 || tl.TTL > 30 || tl.GrantedTTL != 30 || len(tl.Keys) != 1 ||
		string(tl.Keys[0]) != "/etcd-test/leased" {
		fail("TimeToLive: %v %+v", err, tl)
	}
	ll, err := lc.Leases(c)
	found := false
	for _, l := range ll.Leases {
		found = found || l.ID == lg.ID
	}
	if err != nil || !found {
		fail("Leases: %v %+v (want %d)", err, ll, lg.ID)
	}
	if _, err := lc.Revoke(c, lg.ID); err != nil {
		fail("Revoke: %v", err)
	}
	gone, err := fc.Get(c, "/etcd-test/leased")
	if err != nil || gone.Count != 0 {
		fail("the leased key after Revoke: %v %+v", err, gone)
	}
	if tl, err := lc.TimeToLive(c, lg.ID); err != nil || tl.TTL != -1 {
		fail("TimeToLive of a revoked lease: %v %+v (want TTL -1)", err, tl)
	}
	if _, err := lc.Revoke(c, lg.ID); err != rpctypes.ErrLeaseNotFound {
		fail("Revoke of a revoked lease: %v", err)
	}
	if _, err := lc.Put(c, "/etcd-test/l2", "x", clientv3.WithLease(lg.ID)); err != rpctypes.ErrLeaseNotFound {
		fail("Put with a revoked lease: %v", err)
	}
	if _, err := lc.Grant(c, 1<<40); err != rpctypes.ErrLeaseTTLTooLarge {
		fail("Grant of a huge TTL: %v", err)
	}
	ok("Lease: grant, put with it, time to live with keys, leases, revoke (key gone), not found, TTL too large")

	// Refusals etcd clients know.
	_, err = lc.Put(c, "", "x")
	if err != rpctypes.ErrEmptyKey || codeOf(err) != codes.InvalidArgument {
		fail("Put of an empty key: %v", err)
	}
	// A client that sends up to 8 MiB (clientv3's own limit is 2 MiB): the
	// server refuses the 3 MiB message itself.
	bc, err := clientv3.New(clientv3.Config{Endpoints: []string{leaderEp},
		DialTimeout: 10 * time.Second, Logger: zap.NewNop(), MaxCallSendMsgSize: 8 << 20})
	if err != nil {
		fail("dial: %v", err)
	}
	_, err = bc.Put(c, "/etcd-test/big", strings.Repeat("x", 3<<20))
	bc.Close()
	if codeOf(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "tierkv") {
		fail("Put of 3 MiB: %v (want the server's ResourceExhausted)", err)
	}
	ok("refused: empty key (InvalidArgument), 3 MiB message (the server's ResourceExhausted)")

	// A Txn nested thousands deep (protobuf-c unpacks by recursion, with no
	// depth bound: it would overflow the loop's stack) and one with more
	// compares than a Txn takes are refused from their bytes, and the node
	// goes on.
	nested := clientv3.OpPut("/etcd-test/deep", "x")
	for i := 0; i < 5000; i++ {
		nested = clientv3.OpTxn(nil, []clientv3.Op{nested}, nil)
	}
	_, err = lc.Txn(c).Then(nested).Commit()
	if codeOf(err) != codes.Unimplemented || !strings.Contains(err.Error(), "nested") {
		fail("a Txn nested 5000 deep: %v (want Unimplemented, nested)", err)
	}
	cmps := make([]clientv3.Cmp, 200)
	for i := range cmps {
		cmps[i] = clientv3.Compare(clientv3.Version("/etcd-test/b"), ">", -1)
	}
	_, err = lc.Txn(c).If(cmps...).Commit()
	if codeOf(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "too many") {
		fail("a Txn of 200 compares: %v (want InvalidArgument, too many operations)", err)
	}
	if _, err := lc.Get(c, "/etcd-test/b"); err != nil {
		fail("Get after the refused Txns: %v", err)
	}
	ok("refused from the bytes: a Txn nested 5000 deep (Unimplemented), 200 compares (InvalidArgument)")

	// Methods not served yet: Unimplemented, the connection still usable.
	if _, err = lc.Compact(c, 1); err != nil {
		fail("Compact: %v", err)
	}
	if _, err := lc.Get(c, "/etcd-test/b"); err != nil {
		fail("Get after the unimplemented calls: %v", err)
	}
	ok("Compact answered; the client goes on")

	// kvsem.go: prev_kv, ignore_value/ignore_lease, sorts
	kvSemantics(lc, fc)
	streams(lc, fc) // streams.go: Watch, LeaseKeepAlive, concurrency
}

// ---- hostile peers --------------------------------------------------------

// Reads until the server closes the connection, within `limit`.
func closedWithin(conn net.Conn, limit time.Duration) bool {
	conn.SetReadDeadline(time.Now().Add(limit))
	_, err := io.Copy(io.Discard, conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

func h2conn(target string) (net.Conn, *http2.Framer) {
	conn, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		fail("dial %s: %v", target, err)
	}
	conn.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(65536, nil) // one per connection
	fr.WriteSettings()
	return conn, fr
}

func headerBlock(path string) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"},
		{":path", path}, {":authority", "x"}, {"content-type", "application/grpc"},
		{"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	return b.Bytes()
}

// The grpc-status of stream `id`, reading frames for up to 10 s.
func grpcStatus(conn net.Conn, fr *http2.Framer, id uint32) string {
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			fail("reading stream %d's answer: %v", id, err)
		}
		if mh, ok := f.(*http2.MetaHeadersFrame); ok && mh.StreamID == id {
			if s := mh.PseudoValue("status"); s != "" && s != "200" {
				return "http " + s
			}
			for _, hf := range mh.Fields {
				if hf.Name == "grpc-status" {
					return hf.Value
				}
			}
		}
		if rs, ok := f.(*http2.RSTStreamFrame); ok && rs.StreamID == id {
			return "rst " + rs.ErrCode.String()
		}
	}
}

func rangeMsg(key string, rangeEnd string) []byte {
	req := &pb.RangeRequest{Key: []byte(key), RangeEnd: []byte(rangeEnd), Serializable: true}
	m, _ := req.Marshal()
	out := make([]byte, 5+len(m))
	binary.BigEndian.PutUint32(out[1:], uint32(len(m)))
	copy(out[5:], m)
	return out
}

func hostile(target string) {
	// 1. Garbage instead of the preface: closed at once.
	conn, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		fail("dial: %v", err)
	}
	conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff garbage garbage garbage"))
	if !closedWithin(conn, 10*time.Second) {
		fail("garbage preface: the connection stayed open for 10 s")
	}
	conn.Close()
	ok("garbage instead of the HTTP/2 preface: connection closed")

	// 2. A declared message length over the bound: RESOURCE_EXHAUSTED
	// before any of its bytes are sent.
	conn, fr := h2conn(target)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: headerBlock(
		"/etcdserverpb.KV/Put"), EndHeaders: true})
	prefix := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(prefix[1:], 100<<20)
	fr.WriteData(1, false, prefix)
	if s := grpcStatus(conn, fr, 1); s != "8" {
		fail("declared 100 MiB message: grpc-status %q, want 8", s)
	}
	// An unknown method on the same connection: 12 at once.
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: headerBlock(
		"/etcdserverpb.Nope/Nope"), EndHeaders: true})
	if s := grpcStatus(conn, fr, 3); s != "12" {
		fail("an unknown method: grpc-status %q, want 12", s)
	}
	conn.Close()
	ok("declared 100 MiB message: RESOURCE_EXHAUSTED (8); unknown method: 12")

	// 3. Many concurrent streams on one raw connection: past 128 refused,
	// the ones within answered.
	conn, fr = h2conn(target)
	const n = 300
	for i := 0; i < n; i++ {
		id := uint32(2*i + 1)
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: headerBlock(
			"/etcdserverpb.KV/Range"), EndHeaders: true})
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	refused := 0
	for refused == 0 {
		f, err := fr.ReadFrame()
		if err != nil {
			break // the server may also end the connection: fine
		}
		if rs, ok := f.(*http2.RSTStreamFrame); ok && rs.ErrCode != http2.ErrCodeNo {
			refused++
		}
		if _, ok := f.(*http2.GoAwayFrame); ok {
			refused++
		}
	}
	if refused == 0 {
		fail("300 open streams: none refused")
	}
	conn.Close()
	// ... and through grpc-go, which queues past the server's limit: every
	// one of 500 concurrent calls on one connection answers.
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("grpc dial: %v", err)
	}
	kvc := pb.NewKVClient(cc)
	var wg sync.WaitGroup
	errs := make(chan error, 500)
	for i := 0; i < 500; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, cancel := ctx()
			defer cancel()
			_, err := kvc.Range(c, &pb.RangeRequest{Key: []byte("/h/x")})
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		fail("500 concurrent calls: %v", err)
	}
	cc.Close()
	ok("300 raw streams: past the limit refused; 500 concurrent grpc calls all answered")

	// 4. A client that never reads: values of 512 KiB asked again and again
	// over one connection whose answers are never taken, for 20 s. The
	// server holds at most out_max of answers for it (past that it answers
	// RESOURCE_EXHAUSTED, and stops reading it once its output is over the
	// bound); etcd_test.py checks the node's memory after.
	lc := client(target)
	c, cancel := ctx()
	val := strings.Repeat("v", 512<<10)
	for i := 0; i < 4; i++ {
		if _, err := lc.Put(c, fmt.Sprintf("/h/big/%d", i), val); err != nil {
			fail("Put big: %v", err)
		}
	}
	cancel()
	lc.Close()
	conn, fr = h2conn(target)
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetReadBuffer(4096)
	}
	msg := rangeMsg("/h/big/", "/h/big0")
	sent, blocked := 0, false
	deadline := time.Now().Add(20 * time.Second)
	for id := uint32(1); time.Now().Before(deadline) && id < 1<<20; id += 2 {
		conn.SetWriteDeadline(time.Now().Add(3 * time.Second))
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id,
			BlockFragment: headerBlock("/etcdserverpb.KV/Range"), EndHeaders: true}); err != nil {
			blocked = true
			break
		}
		if err := fr.WriteData(id, true, msg); err != nil {
			blocked = true
			break
		}
		sent++
	}
	fmt.Printf("     never-reading client: %d requests written; the server stopped reading: %v\n",
		sent, blocked)
	// Still healthy for others while that connection is held open.
	lc = client(target)
	c, cancel = ctx()
	if _, err := lc.Get(c, "/h/big/0"); err != nil {
		fail("Get beside the never-reading client: %v", err)
	}
	cancel()
	lc.Close()
	conn.Close()
	ok("a client that never reads: others served beside it")

	hostileStreams(target) // streams.go
}

func main() {
	mode := flag.String("mode", "functional", "functional, hostile, tls or auth")
	leader := flag.String("leader", "", "the leader's --listen-client")
	follower := flag.String("follower", "", "a follower's --listen-client")
	target := flag.String("target", "", "hostile: the node to attack")
	flag.Parse()
	switch *mode {
	case "functional":
		functional(*leader, *follower)
	case "hostile":
		hostile(*target)
	case "tls":
		tlsMode(*target) // tls.go
	case "auth":
		authMode(*target) // auth.go
	case "mx": // mutex.go: mutex_test.py's workers
		mxMain(flag.Args())
	default:
		fail("unknown mode %q", *mode)
	}
}
