// Watch fragments (etcdapi_watch.c, WatchCreateRequest.fragment): one
// revision whose events are too large for one message. 1000 keys of 3 KiB
// deleted by one DeleteRange step are one revision of 1000 events, and with
// prev_kv about 3 MiB: over a gRPC message (2 MiB + 64 KiB). A watch made
// WithFragment gets them all, split by the server and joined by clientv3;
// the same watch without it is canceled (the control that the revision is
// indeed over the limit).
package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func fragments(lc *clientv3.Client) {
	const n, size = 1000, 3 << 10
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	val := func(i int) string {
		return strings.Repeat(fmt.Sprintf("%04d", i), size/4)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < n; i += 16 {
				if _, err := lc.Put(c, fmt.Sprintf("/frag/%04d", i), val(i)); err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		fail("fragments: a put: %v", err)
	}
	wf := lc.Watch(c, "/frag/", clientv3.WithPrefix(), clientv3.WithPrevKV(),
		clientv3.WithFragment(), clientv3.WithCreatedNotify())
	wn := lc.Watch(c, "/frag/", clientv3.WithPrefix(), clientv3.WithPrevKV(),
		clientv3.WithCreatedNotify())
	for _, w := range []clientv3.WatchChan{wf, wn} {
		if r := <-w; !r.Created {
			fail("fragments: the watch was not created: %+v", r)
		}
	}
	del, err := lc.Delete(c, "/frag/", clientv3.WithPrefix())
	if err != nil || del.Deleted != n {
		fail("fragments: Delete: %v %v", err, del)
	}
	var got []*clientv3.Event
	deadline := time.After(30 * time.Second)
	for len(got) < n {
		select {
		case r, open := <-wf:
			if !open || r.Err() != nil || r.Canceled {
				fail("fragments: the fragmenting watch ended after %d events: %v", len(got),
					r.Err())
			}
			got = append(got, r.Events...)
		case <-deadline:
			fail("fragments: %d of %d events in 30 s", len(got), n)
		}
	}
	rev := got[0].Kv.ModRevision
	for i, ev := range got {
		want := fmt.Sprintf("/frag/%04d", i)
		if ev.Type != clientv3.EventTypeDelete || string(ev.Kv.Key) != want ||
			ev.Kv.ModRevision != rev || ev.PrevKv == nil ||
			!bytes.Equal(ev.PrevKv.Value, []byte(val(i))) {
			fail("fragments: event %d: %v %q rev %d (first %d), prev %v", i, ev.Type,
				ev.Kv.Key, ev.Kv.ModRevision, rev, ev.PrevKv != nil)
		}
	}
	ok("a watch WithFragment: all %d deletes of revision %d (%.1f MiB with prev_kv) "+
		"joined, in order", n, rev, float64(n*size)/(1<<20))
	// clientv3 does not pass a cancel without a compact revision on: the
	// channel closes.
	select {
	case r, open := <-wn:
		if open || len(r.Events) > 0 {
			fail("fragments: the watch without fragment: open %v, %d events, %v", open,
				len(r.Events), r.Err())
		}
		ok("the same watch without fragment: ended (canceled), no event")
	case <-time.After(30 * time.Second):
		fail("fragments: the watch without fragment neither answered nor ended in 30 s")
	}
}
