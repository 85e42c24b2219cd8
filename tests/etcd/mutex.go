// The worker modes mutex_test.py runs, several processes at once against a
// 3-node cluster whose leader it kills and restarts meanwhile (issue 50
// item 4). Each mode writes one JSON line per event to -out and runs until
// the file -stop exists (or -max-seconds pass):
//
//	etcd-client -mode mx -- -role mutex|unfenced|campaign|pretend|observe|revisions \
//	    -endpoints A,B,C -id W -out FILE -stop FILE [-ttl 3]
//
// mutex: a concurrency.Mutex around "read /mx/counter, write it + 1", the
// write a Txn guarded by If(mutex.IsOwner()) (the fenced write etcd's docs
// recommend). The counter's value is "N W SEQ": the checker links each write
// to the one it read, and so learns which writes whose answer was lost
// (an error: applied or not) did apply. One "cs" line per critical section:
// the lock key, its create revision (the fencing revision), the value read,
// the value written and the Txn's outcome ("ok", "refused": the fence held
// it back, "error": unknown).
//
// unfenced: the known-bad control: the same read and write with no lock and
// no fence, so that four of them lose increments.
//
// campaign: a concurrency.Election's Campaign; once it returns, a
// linearizable Get of every candidate key (its header revision "start"):
// this candidate's key must be the oldest; held briefly; the same Get
// ("end"); then Resign. One "term" line per Campaign that returned.
//
// pretend: the known-bad control of campaign: it puts its key and leads at
// once, waiting for no older key to go.
//
// observe: Election.Observe; one "seen" line per leader key it posts.
//
// revisions: the key-creating Txns of Mutex.Lock and Election.Campaign, whose
// header revision both take for their key's create revision; one "rev" line
// each with both.
//
// The checks are mutex_test.py's, over every worker's lines together; a
// worker exits 1 only when it cannot work at all (bad flags, no output).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

const (
	mxCounter   = "/mx/counter"
	mxLock      = "/mx/lock"
	mxElection  = "/mx/elect"
	mxOpTimeout = 5 * time.Second  // one RPC
	mxWaitMax   = 10 * time.Second // one Lock or Campaign attempt
)

type mxWorker struct {
	cli      *clientv3.Client
	id       string
	ttl      int64
	out      *os.File
	stop     string
	deadline time.Time
	sess     *concurrency.Session
}

// One JSON line; the file is the record, so a failed write ends the worker.
func (w *mxWorker) emit(rec map[string]any) {
	rec["w"] = w.id
	rec["t"] = time.Now().UnixNano()
	b, err := json.Marshal(rec)
	if err == nil {
		_, err = w.out.Write(append(b, '\n'))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: writing the record: %v\n", w.id, err)
		os.Exit(1)
	}
}

func (w *mxWorker) running() bool {
	if time.Now().After(w.deadline) {
		return false
	}
	_, err := os.Stat(w.stop)
	return err != nil
}

func mxErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// A live session: the current one, or a new one on a lease granted within
// mxOpTimeout (NewSession's own Grant would wait as long as the client
// lives). nil when the cluster gave none this time.
func (w *mxWorker) session() *concurrency.Session {
	if w.sess != nil {
		select {
		case <-w.sess.Done():
			w.emit(map[string]any{"ev": "session-expired", "lease": int64(w.sess.Lease())})
			w.sess = nil
		default:
			return w.sess
		}
	}
	c, cancel := context.WithTimeout(context.Background(), mxOpTimeout)
	defer cancel()
	g, err := w.cli.Grant(c, w.ttl)
	if err != nil {
		w.emit(map[string]any{"ev": "grant-error", "err": mxErr(err)})
		time.Sleep(100 * time.Millisecond)
		return nil
	}
	s, err := concurrency.NewSession(w.cli, concurrency.WithTTL(int(w.ttl)),
		concurrency.WithLease(g.ID))
	if err != nil {
		w.emit(map[string]any{"ev": "session-error", "err": mxErr(err)})
		return nil
	}
	w.sess = s
	return s
}

// Drops the session (its lease revoked if the cluster answers, else it
// expires by its TTL): its lock key is never used again.
func (w *mxWorker) dropSession() {
	if w.sess == nil {
		return
	}
	c, cancel := context.WithTimeout(context.Background(), mxOpTimeout)
	defer cancel()
	_, err := w.cli.Revoke(c, w.sess.Lease())
	w.sess.Orphan()
	w.sess = nil
	w.emit(map[string]any{"ev": "session-dropped", "err": mxErr(err)})
}

// After a failed Lock or Campaign: a session whose lease the cluster no
// longer has goes (its keepalive may not have told it yet); a short pause,
// so that a cluster without a leader is not asked in a tight loop.
func (w *mxWorker) afterError(err error) {
	if errors.Is(err, concurrency.ErrSessionExpired) ||
		errors.Is(err, rpctypes.ErrLeaseNotFound) {
		w.dropSession()
	}
	time.Sleep(50 * time.Millisecond)
}

// The counter's value and the line that wrote it ("" when absent).
func (w *mxWorker) readCounter() (int64, string, error) {
	c, cancel := context.WithTimeout(context.Background(), mxOpTimeout)
	defer cancel()
	r, err := w.cli.Get(c, mxCounter)
	if err != nil {
		return 0, "", err
	}
	if len(r.Kvs) == 0 {
		return 0, "", nil
	}
	v := string(r.Kvs[0].Value)
	n, err := strconv.ParseInt(strings.Fields(v + " x")[0], 10, 64)
	if err != nil {
		return 0, v, fmt.Errorf("counter value %q: %v", v, err)
	}
	return n, v, nil
}

// The write: a Txn with `cmps` (none for the control), its outcome.
func (w *mxWorker) writeCounter(cmps []clientv3.Cmp, val string) (string, int64, error) {
	c, cancel := context.WithTimeout(context.Background(), mxOpTimeout)
	defer cancel()
	r, err := w.cli.Txn(c).If(cmps...).Then(clientv3.OpPut(mxCounter, val)).Commit()
	if err != nil {
		return "error", 0, err
	}
	if !r.Succeeded {
		return "refused", r.Header.Revision, nil
	}
	return "ok", r.Header.Revision, nil
}

// The create revision a Mutex compares its key with (IsOwner).
func mxFence(m *concurrency.Mutex) int64 {
	if cr, ok := m.IsOwner().TargetUnion.(*pb.Compare_CreateRevision); ok {
		return cr.CreateRevision
	}
	return -1
}

func (w *mxWorker) mutexLoop(fenced bool) {
	used := map[string]bool{} // lock key@revision of every critical section so far
	for seq := 1; w.running(); seq++ {
		var m *concurrency.Mutex
		var cmps []clientv3.Cmp
		var fence, hrev int64
		if fenced {
			s := w.session()
			if s == nil {
				continue
			}
			m = concurrency.NewMutex(s, mxLock)
			c, cancel := context.WithTimeout(context.Background(), mxWaitMax)
			t0 := time.Now()
			err := m.Lock(c)
			cancel()
			if err != nil {
				w.emit(map[string]any{"ev": "lock-error", "err": mxErr(err),
					"ms": time.Since(t0).Milliseconds()})
				w.afterError(err)
				continue
			}
			fence, hrev = mxFence(m), m.Header().Revision
			tag := fmt.Sprintf("%s@%d", m.Key(), fence)
			if used[tag] {
				// The key of an earlier critical section whose Unlock
				// did not apply: a critical section never reuses one.
				w.emit(map[string]any{"ev": "key-reused", "key": tag})
				w.dropSession()
				continue
			}
			used[tag] = true
			cmps = []clientv3.Cmp{m.IsOwner()}
		}
		rec := map[string]any{"ev": "cs", "seq": seq, "fence": fence, "lock_hdr": hrev}
		if m != nil {
			rec["key"] = m.Key()
		}
		n, prev, err := w.readCounter()
		rec["read"] = prev
		if err != nil {
			rec["outcome"] = "read-error"
			rec["err"] = mxErr(err)
		} else {
			val := fmt.Sprintf("%d %s %d", n+1, w.id, seq)
			outcome, rev, err := w.writeCounter(cmps, val)
			rec["wrote"], rec["outcome"], rec["txn_hdr"] = val, outcome, rev
			rec["err"] = mxErr(err)
		}
		w.emit(rec)
		if m != nil {
			w.unlock(m)
		}
	}
}

// Unlock (a delete: safe to repeat) until it answers, 3 tries; else the
// session goes, and its key with it.
func (w *mxWorker) unlock(m *concurrency.Mutex) {
	key := m.Key()
	for try := 0; try < 3; try++ {
		c, cancel := context.WithTimeout(context.Background(), mxOpTimeout)
		err := m.Unlock(c)
		cancel()
		if err == nil {
			return
		}
		w.emit(map[string]any{"ev": "unlock-error", "key": key, "err": mxErr(err)})
		time.Sleep(100 * time.Millisecond)
	}
	w.dropSession()
}

// Every candidate key under the election prefix: the oldest's key, whether
// `mine` is there, the read's header revision.
func (w *mxWorker) electionState(mine string) (string, bool, int64, error) {
	c, cancel := context.WithTimeout(context.Background(), mxOpTimeout)
	defer cancel()
	r, err := w.cli.Get(c, mxElection+"/", clientv3.WithPrefix())
	if err != nil {
		return "", false, 0, err
	}
	oldest, present := "", false
	var oldestRev int64
	for _, kv := range r.Kvs {
		if oldest == "" || kv.CreateRevision < oldestRev {
			oldest, oldestRev = string(kv.Key), kv.CreateRevision
		}
		present = present || string(kv.Key) == mine
	}
	return oldest, present, r.Header.Revision, nil
}

// A candidate's key, as Campaign makes it, and its create revision; the
// known-bad control's "pretend" role leads at once with it, waiting for no
// older key to go.
func (w *mxWorker) pretend(s *concurrency.Session, val string) (string, int64, error) {
	k := fmt.Sprintf("%s/%x", mxElection, s.Lease())
	c, cancel := context.WithTimeout(context.Background(), mxOpTimeout)
	defer cancel()
	if _, err := w.cli.Put(c, k, val, clientv3.WithLease(s.Lease())); err != nil {
		return "", 0, err
	}
	g, err := w.cli.Get(c, k)
	if err == nil && len(g.Kvs) == 0 {
		err = concurrency.ErrSessionExpired
	}
	if err != nil {
		return "", 0, err
	}
	return k, g.Kvs[0].CreateRevision, nil
}

// Campaign (or, with `pretend`, lead at once), two reads of the candidates a
// hold apart, Resign (or delete the key).
func (w *mxWorker) campaignLoop(hold time.Duration, pretend bool) {
	for seq := 1; w.running(); seq++ {
		s := w.session()
		if s == nil {
			continue
		}
		e := concurrency.NewElection(s, mxElection)
		val := fmt.Sprintf("%s %d", w.id, seq)
		c, cancel := context.WithTimeout(context.Background(), mxWaitMax)
		t0 := time.Now()
		var key string
		var crev int64
		var err error
		if pretend {
			key, crev, err = w.pretend(s, val)
		} else if err = e.Campaign(c, val); err == nil {
			key, crev = e.Key(), e.Rev()
		}
		cancel()
		if err != nil {
			w.emit(map[string]any{"ev": "campaign-error", "err": mxErr(err),
				"ms": time.Since(t0).Milliseconds()})
			w.afterError(err)
			continue
		}
		rec := map[string]any{"ev": "term", "seq": seq, "key": key, "crev": crev,
			"val": val, "campaign_ms": time.Since(t0).Milliseconds()}
		oldest, present, rev, err := w.electionState(key)
		rec["start"], rec["start_oldest"], rec["start_present"] = rev, oldest, present
		rec["start_err"] = mxErr(err)
		time.Sleep(hold)
		oldest, present, rev, err = w.electionState(key)
		rec["end"], rec["end_oldest"], rec["end_present"] = rev, oldest, present
		rec["end_err"] = mxErr(err)
		c, cancel = context.WithTimeout(context.Background(), mxOpTimeout)
		if pretend {
			_, err = w.cli.Delete(c, key)
		} else {
			err = e.Resign(c)
		}
		cancel()
		rec["resign_err"] = mxErr(err)
		w.emit(rec)
		if err != nil {
			w.dropSession() // its key goes with the lease
		}
	}
}

// The Txns Mutex.Lock and Election.Campaign send to create their key (with
// and without Range ops: If(CreateRevision(k) = 0).Then(Put(k), ...)), each
// on a new key, then a Get of the key: both take the Txn's header revision
// for the key's create revision, as etcd answers it. One "rev" line each.
func (w *mxWorker) revisionsLoop() {
	for seq := 1; w.running(); seq++ {
		s := w.session()
		if s == nil {
			continue
		}
		k := fmt.Sprintf("/mx/rev/%x-%d", s.Lease(), seq)
		ops := []clientv3.Op{clientv3.OpPut(k, "", clientv3.WithLease(s.Lease()))}
		if seq%2 == 0 {
			ops = append(ops, clientv3.OpGet("/mx/rev/", clientv3.WithFirstCreate()...))
		}
		c, cancel := context.WithTimeout(context.Background(), mxOpTimeout)
		r, err := w.cli.Txn(c).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(ops...).Commit()
		var g *clientv3.GetResponse
		if err == nil {
			g, err = w.cli.Get(c, k)
		}
		cancel()
		if err == nil && len(g.Kvs) == 1 && r.Succeeded {
			w.emit(map[string]any{"ev": "rev", "key": k, "ranges": len(ops) - 1,
				"hdr": r.Header.Revision, "crev": g.Kvs[0].CreateRevision,
				"member": r.Header.MemberId})
		}
		c, cancel = context.WithTimeout(context.Background(), mxOpTimeout)
		w.cli.Delete(c, k)
		cancel()
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *mxWorker) observeLoop() {
	for w.running() {
		s := w.session()
		if s == nil {
			continue
		}
		c, cancel := context.WithCancel(context.Background())
		e := concurrency.NewElection(s, mxElection)
		ch := e.Observe(c)
		for open := true; open && w.running(); {
			select {
			case r, ok := <-ch:
				if !ok {
					w.emit(map[string]any{"ev": "observe-closed"})
					open = false
					break
				}
				kv := r.Kvs[0]
				w.emit(map[string]any{"ev": "seen", "key": string(kv.Key),
					"crev": kv.CreateRevision, "val": string(kv.Value),
					"hdr": r.Header.Revision})
			case <-time.After(200 * time.Millisecond):
			}
		}
		cancel()
	}
}

// mxMain: -mode mx's own flags, after main's (`-mode mx -- ...`).
func mxMain(args []string) {
	fs := flag.NewFlagSet("mx", flag.ExitOnError)
	role := fs.String("role", "mutex", "mutex, unfenced, campaign or observe")
	eps := fs.String("endpoints", "", "every node's --listen-client, comma-separated")
	id := fs.String("id", "w", "this worker's name in its records")
	out := fs.String("out", "", "the JSON lines' file")
	stop := fs.String("stop", "", "run until this file exists")
	ttl := fs.Int64("ttl", 3, "session TTL, seconds")
	hold := fs.Duration("hold", 100*time.Millisecond, "campaign: how long a leader leads")
	maxs := fs.Int("max-seconds", 120, "run at most this long")
	fs.Parse(args)
	if *eps == "" || *out == "" || *stop == "" {
		fail("mx: -endpoints, -out and -stop are required")
	}
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fail("mx: %v", err)
	}
	defer f.Close()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(*eps, ","),
		DialTimeout: mxOpTimeout,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		fail("mx: client: %v", err)
	}
	defer cli.Close()
	w := &mxWorker{cli: cli, id: *id, ttl: *ttl, out: f, stop: *stop,
		deadline: time.Now().Add(time.Duration(*maxs) * time.Second)}
	w.emit(map[string]any{"ev": "start", "role": *role})
	switch *role {
	case "mutex":
		w.mutexLoop(true)
	case "unfenced":
		w.mutexLoop(false)
	case "campaign", "pretend":
		w.campaignLoop(*hold, *role == "pretend")
	case "revisions":
		w.revisionsLoop()
	case "observe":
		w.observeLoop()
	default:
		fail("mx: unknown role %q", *role)
	}
	if w.sess != nil {
		w.sess.Close()
	}
	w.emit(map[string]any{"ev": "end", "stopped": !time.Now().After(w.deadline)})
}
