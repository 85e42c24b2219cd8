// snapcheck: Maintenance.Snapshot's bounds on one tierkvd node, through
// grpc-go and etcd's generated client (etcdctl_test.py runs it; never part
// of the server). It writes about 20 MiB, then: two Snapshot streams whose
// client reads one message and then nothing; a third refused
// (ResourceExhausted); the first canceled (its client leaves), after which a
// new one is served whole within a bounded time (the slot came back): every
// message's remaining_bytes the bytes still to come, the size 32 mod 512;
// and the second, never read, cut by the node (ResourceExhausted, or its
// connection closed) once it went 30 s unread. Prints one line per step; exit 1 on the
// first failure.
//
//	snapcheck ENDPOINT
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func fail(format string, a ...any) {
	fmt.Printf("FAIL "+format+"\n", a...)
	os.Exit(1)
}

func dial(ep string) *grpc.ClientConn {
	cc, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4<<20)))
	if err != nil {
		fail("dial %s: %v", ep, err)
	}
	return cc
}

// open starts a Snapshot stream on its own connection (so that a stream
// nobody reads holds only its own connection's window) and reads its first
// message.
func open(ep string) (*grpc.ClientConn, context.CancelFunc, pb.Maintenance_SnapshotClient,
	*pb.SnapshotResponse, error) {
	cc := dial(ep)
	ctx, cancel := context.WithCancel(context.Background())
	s, err := pb.NewMaintenanceClient(cc).Snapshot(ctx, &pb.SnapshotRequest{})
	if err != nil {
		cancel()
		cc.Close()
		return nil, nil, nil, nil, err
	}
	r, err := s.Recv()
	if err != nil {
		cancel()
		cc.Close()
		return nil, nil, nil, nil, err
	}
	return cc, cancel, s, r, nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Println("usage: snapcheck ENDPOINT")
		os.Exit(2)
	}
	ep := os.Args[1]
	cc := dial(ep)
	kv := pb.NewKVClient(cc)
	val := []byte(strings.Repeat("s", 900<<10))
	for i := 0; i < 24; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := kv.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("/snapbig/%02d", i)),
			Value: val})
		cancel()
		if err != nil {
			fail("put: %v", err)
		}
	}
	cc.Close()

	cc1, cancel1, _, r1, err := open(ep)
	if err != nil {
		fail("first stream: %v", err)
	}
	total := r1.RemainingBytes + uint64(len(r1.Blob))
	if r1.Version != "3.6.0" || r1.Header == nil || r1.Header.Revision <= 0 ||
		total%512 != 32 || total < 20<<20 || len(r1.Blob) > 64<<10 {
		fail("first message: version %q header %v total %d blob %d", r1.Version,
			r1.Header, total, len(r1.Blob))
	}
	cc2, cancel2, s2, _, err := open(ep)
	if err != nil {
		fail("second stream: %v", err)
	}
	opened2 := time.Now()
	_, _, _, _, err = open(ep)
	if status.Code(err) != codes.ResourceExhausted ||
		!strings.Contains(err.Error(), "snapshots are being sent") {
		fail("a third stream: %v (want ResourceExhausted)", err)
	}
	fmt.Printf("ok   2 streams held unread (%d bytes each), a third refused: %v\n", total,
		status.Convert(err).Message())

	// The first client leaves: its slot comes back.
	cancel1()
	cc1.Close()
	deadline := time.Now().Add(10 * time.Second)
	var s3 pb.Maintenance_SnapshotClient
	var r3 *pb.SnapshotResponse
	for {
		var cc3 *grpc.ClientConn
		var cancel3 context.CancelFunc
		cc3, cancel3, s3, r3, err = open(ep)
		if err == nil {
			defer cc3.Close()
			defer cancel3()
			break
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			fail("a stream after the first left: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// a later snapshot (a follower may have applied more since): its own size
	got := uint64(len(r3.Blob))
	total = r3.RemainingBytes + got
	if r3.Version != "3.6.0" || total%512 != 32 || total < 20<<20 {
		fail("the new stream's first message: version %q, total %d", r3.Version, total)
	}
	msgs := 1
	for {
		r, err := s3.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fail("reading the new stream after %d bytes: %v", got, err)
		}
		if r.Version != "" || len(r.Blob) == 0 || len(r.Blob) > 64<<10 {
			fail("message %d: version %q, %d bytes", msgs, r.Version, len(r.Blob))
		}
		got += uint64(len(r.Blob))
		msgs++
		if r.RemainingBytes != total-got {
			fail("message %d: remaining_bytes %d, want %d", msgs, r.RemainingBytes,
				total-got)
		}
	}
	if got != total {
		fail("the new stream sent %d bytes of %d", got, total)
	}
	fmt.Printf("ok   the first client left; a new stream served whole: %d messages\n", msgs)

	// The second was not read since its first message: past the node's
	// 30 s without progress, reading it gives what its window held, then
	// the cut.
	time.Sleep(time.Until(opened2.Add(35 * time.Second)))
	for {
		_, err := s2.Recv()
		if err == nil {
			continue // what its window held before the cut
		}
		c := status.Code(err)
		if c != codes.ResourceExhausted && c != codes.Unavailable {
			fail("the unread stream ended with %v", err)
		}
		fmt.Printf("ok   the unread stream was cut: %v\n", status.Convert(err).Message())
		break
	}
	cancel2()
	cc2.Close()
}
