// etcd's KV semantics beyond the basics (etcdapi/etcdapi_kv.c): prev_kv on
// Put and DeleteRange, ignore_value and ignore_lease with etcd's errors,
// Range's sorts with and without a limit, checked against a sort in Go, and
// Txn compares on LEASE and over ranges.
// Called from main.go's functional mode, after the basic KV checks.
package main

import (
	"bytes"
	"fmt"
	"math/rand"
	"sort"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
)

const kvsemPrefix = "/kvsem/"

// The key's current create and mod revision and version, read through cl.
func kvsemStat(cl *clientv3.Client, key string) *mvccpb.KeyValue {
	c, cancel := ctx()
	defer cancel()
	g, err := cl.Get(c, key)
	if err != nil || len(g.Kvs) != 1 {
		fail("Get %s: %v %+v", key, err, g)
	}
	return g.Kvs[0]
}

// prev (a prev_kv answered) is want (read before the write): key, value,
// revisions, version and lease.
func kvsemSamePrev(what string, prev, want *mvccpb.KeyValue) {
	if prev == nil {
		fail("%s: no prev_kv, want %q=%q", what, want.Key, want.Value)
	}
	if !bytes.Equal(prev.Key, want.Key) || !bytes.Equal(prev.Value, want.Value) ||
		prev.CreateRevision != want.CreateRevision || prev.ModRevision != want.ModRevision ||
		prev.Version != want.Version || prev.Lease != want.Lease {
		fail("%s: prev_kv %q=%q create %d mod %d version %d lease %x, want %q=%q %d %d %d %x",
			what, prev.Key, prev.Value, prev.CreateRevision, prev.ModRevision, prev.Version,
			prev.Lease, want.Key, want.Value, want.CreateRevision, want.ModRevision,
			want.Version, want.Lease)
	}
}

func kvsemPrevKV(lc, fc *clientv3.Client) {
	c, cancel := ctx()
	defer cancel()
	for _, side := range []struct {
		name string
		cl   *clientv3.Client
	}{{"leader", lc}, {"follower", fc}} {
		k := kvsemPrefix + "p/" + side.name
		r, err := side.cl.Put(c, k, "v1", clientv3.WithPrevKV())
		if err != nil || r.PrevKv != nil {
			fail("Put %s with prev_kv (new key) via %s: %v, prev %+v", k, side.name, err, r)
		}
		was := kvsemStat(lc, k)
		r, err = side.cl.Put(c, k, "v2", clientv3.WithPrevKV())
		if err != nil {
			fail("Put with prev_kv via %s: %v", side.name, err)
		}
		kvsemSamePrev("Put v2 via "+side.name, r.PrevKv, was)
		was = kvsemStat(lc, k)
		r, err = side.cl.Put(c, k, "value three", clientv3.WithPrevKV())
		if err != nil {
			fail("Put with prev_kv via %s: %v", side.name, err)
		}
		kvsemSamePrev("Put v3 via "+side.name, r.PrevKv, was)
		if was.Version != 2 || was.CreateRevision >= was.ModRevision {
			fail("%s after two puts: version %d create %d mod %d", k, was.Version,
				was.CreateRevision, was.ModRevision)
		}
		was = kvsemStat(lc, k)
		d, err := side.cl.Delete(c, k, clientv3.WithPrevKV())
		if err != nil || d.Deleted != 1 || len(d.PrevKvs) != 1 {
			fail("Delete %s with prev_kv via %s: %v %+v", k, side.name, err, d)
		}
		kvsemSamePrev("Delete via "+side.name, d.PrevKvs[0], was)
		d, err = side.cl.Delete(c, k, clientv3.WithPrevKV())
		if err != nil || d.Deleted != 0 || len(d.PrevKvs) != 0 {
			fail("Delete of a missing key with prev_kv via %s: %v %+v", side.name, err, d)
		}
		// Without prev_kv: none answered.
		if r, err = side.cl.Put(c, k, "x"); err != nil || r.PrevKv != nil {
			fail("Put without prev_kv via %s: %v %+v", side.name, err, r)
		}
	}
	ok("prev_kv on Put and single-key Delete via the leader and a follower: the previous value, create/mod revision and version; none for a new or missing key")

	// A prefix delete over more than one step (1000 keys a step) through the
	// follower: every deleted key's previous key-value.
	const n = 1100
	want := map[string]string{}
	for i := 0; i < n; i += 100 {
		ops := []clientv3.Op{}
		for j := i; j < i+100; j++ {
			k := fmt.Sprintf("%sd/%05d", kvsemPrefix, j)
			v := fmt.Sprintf("value-%d-%s", j, strings.Repeat("z", j%7))
			want[k] = v
			ops = append(ops, clientv3.OpPut(k, v))
		}
		if _, err := lc.Txn(c).Then(ops...).Commit(); err != nil {
			fail("Txn of 100 puts: %v", err)
		}
	}
	if _, err := lc.Put(c, kvsemPrefix+"d/00007", want[kvsemPrefix+"d/00007"]); err != nil {
		fail("Put: %v", err)
	}
	d, err := fc.Delete(c, kvsemPrefix+"d/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	if err != nil || d.Deleted != n || len(d.PrevKvs) != n {
		fail("prefix Delete of %d keys with prev_kv via the follower: %v, deleted %d, %d prev_kvs",
			n, err, d.Deleted, len(d.PrevKvs))
	}
	seen := map[string]bool{}
	for _, kv := range d.PrevKvs {
		k := string(kv.Key)
		wantVersion := int64(1)
		if k == kvsemPrefix+"d/00007" {
			wantVersion = 2
		}
		if want[k] != string(kv.Value) || seen[k] || kv.Version != wantVersion ||
			kv.ModRevision < kv.CreateRevision || kv.CreateRevision == 0 {
			fail("prefix Delete's prev_kv %q=%q version %d (create %d mod %d): want %q version %d, once",
				k, kv.Value, kv.Version, kv.CreateRevision, kv.ModRevision, want[k], wantVersion)
		}
		seen[k] = true
	}
	ok("prev_kv on a prefix Delete of %d keys (two steps) via the follower: each key's previous value and version, once", n)
}

func kvsemIgnore(lc, fc *clientv3.Client) {
	c, cancel := ctx()
	defer cancel()
	lg, err := lc.Grant(c, 60)
	if err != nil {
		fail("Grant: %v", err)
	}
	attached := func(key string) bool {
		t, err := lc.TimeToLive(c, lg.ID, clientv3.WithAttachedKeys())
		if err != nil {
			fail("TimeToLive: %v", err)
		}
		for _, k := range t.Keys {
			if string(k) == key {
				return true
			}
		}
		return false
	}
	k := kvsemPrefix + "i/k"
	if _, err := lc.Put(c, k, "orig", clientv3.WithLease(lg.ID)); err != nil {
		fail("Put with a lease: %v", err)
	}
	was := kvsemStat(lc, k)
	if was.Lease != int64(lg.ID) {
		fail("Get of a key put with lease %x: its lease is %x", lg.ID, was.Lease)
	}
	// ignore_value through the follower, no lease given: the value stays,
	// the lease goes (as etcd's: lease 0 detaches); prev_kv with it (and
	// the lease it had).
	r, err := fc.Put(c, k, "", clientv3.WithIgnoreValue(), clientv3.WithPrevKV())
	if err != nil {
		fail("Put with ignore_value via the follower: %v", err)
	}
	kvsemSamePrev("Put with ignore_value", r.PrevKv, was)
	now := kvsemStat(lc, k)
	if string(now.Value) != "orig" || now.Version != 2 || now.ModRevision <= was.ModRevision {
		fail("after ignore_value: %q version %d mod %d", now.Value, now.Version, now.ModRevision)
	}
	if attached(k) || now.Lease != 0 {
		fail("after ignore_value without a lease: still attached to the lease (%x)", now.Lease)
	}
	// ignore_lease: a new value, the lease kept.
	if _, err := lc.Put(c, k, "orig", clientv3.WithLease(lg.ID)); err != nil {
		fail("Put with a lease: %v", err)
	}
	if _, err := lc.Put(c, k, "new", clientv3.WithIgnoreLease()); err != nil {
		fail("Put with ignore_lease: %v", err)
	}
	if now = kvsemStat(fc, k); string(now.Value) != "new" || !attached(k) ||
		now.Lease != int64(lg.ID) {
		fail("after ignore_lease: %q, attached %v, lease %x", now.Value, attached(k), now.Lease)
	}
	// Both: only the revision and version move.
	if _, err := fc.Put(c, k, "", clientv3.WithIgnoreValue(), clientv3.WithIgnoreLease()); err != nil {
		fail("Put with ignore_value and ignore_lease: %v", err)
	}
	if now = kvsemStat(lc, k); string(now.Value) != "new" || now.Version != 5 || !attached(k) {
		fail("after both: %q version %d attached %v", now.Value, now.Version, attached(k))
	}
	// etcd's errors.
	for _, cl := range []*clientv3.Client{lc, fc} {
		_, err = cl.Put(c, kvsemPrefix+"i/absent", "", clientv3.WithIgnoreValue())
		if err != rpctypes.ErrKeyNotFound || codeOf(err) != codes.InvalidArgument {
			fail("ignore_value on a missing key: %v (want %v)", err, rpctypes.ErrKeyNotFound)
		}
		_, err = cl.Put(c, kvsemPrefix+"i/absent", "v", clientv3.WithIgnoreLease())
		if err != rpctypes.ErrKeyNotFound {
			fail("ignore_lease on a missing key: %v (want %v)", err, rpctypes.ErrKeyNotFound)
		}
		_, err = cl.Put(c, k, "v", clientv3.WithIgnoreValue())
		if err != rpctypes.ErrValueProvided || codeOf(err) != codes.InvalidArgument {
			fail("ignore_value with a value: %v (want %v)", err, rpctypes.ErrValueProvided)
		}
		_, err = cl.Put(c, k, "v", clientv3.WithIgnoreLease(), clientv3.WithLease(lg.ID))
		if err != rpctypes.ErrLeaseProvided || codeOf(err) != codes.InvalidArgument {
			fail("ignore_lease with a lease: %v (want %v)", err, rpctypes.ErrLeaseProvided)
		}
	}
	if g, err := lc.Get(c, kvsemPrefix+"i/absent"); err != nil || len(g.Kvs) != 0 {
		fail("the refused puts wrote: %v %+v", err, g)
	}
	if now = kvsemStat(lc, k); string(now.Value) != "new" || now.Version != 5 {
		fail("the refused puts changed %s: %q version %d", k, now.Value, now.Version)
	}
	if _, err := lc.Revoke(c, lg.ID); err != nil {
		fail("Revoke: %v", err)
	}
	ok("ignore_value and ignore_lease via the leader and a follower (value or lease kept, with prev_kv); etcd's key not found, value provided and lease provided errors, nothing written")
}

// The sorted target of kv as a comparable string or number.
func kvsemLess(target clientv3.SortTarget, a, b *mvccpb.KeyValue) int {
	num := func(x, y int64) int {
		if x < y {
			return -1
		}
		if x > y {
			return 1
		}
		return 0
	}
	switch target {
	case clientv3.SortByKey:
		return bytes.Compare(a.Key, b.Key)
	case clientv3.SortByVersion:
		return num(a.Version, b.Version)
	case clientv3.SortByCreateRevision:
		return num(a.CreateRevision, b.CreateRevision)
	case clientv3.SortByModRevision:
		return num(a.ModRevision, b.ModRevision)
	default:
		return bytes.Compare(a.Value, b.Value)
	}
}

func kvsemSorts(lc, fc *clientv3.Client) {
	c, cancel := ctx()
	defer cancel()
	pre := kvsemPrefix + "s/"
	rng := rand.New(rand.NewSource(50))
	const n = 40
	order := rng.Perm(n) // created out of key order
	for _, i := range order {
		k := fmt.Sprintf("%s%02d", pre, i)
		for w := 0; w <= rng.Intn(4); w++ { // versions 1 to 4
			v := fmt.Sprintf("%c%d", 'a'+rng.Intn(26), rng.Intn(1000))
			if _, err := lc.Put(c, k, v); err != nil {
				fail("Put: %v", err)
			}
		}
	}
	all, err := lc.Get(c, pre, clientv3.WithPrefix())
	if err != nil || len(all.Kvs) != n {
		fail("Get the sort keys: %v", err)
	}
	targets := []struct {
		name string
		t    clientv3.SortTarget
	}{{"key", clientv3.SortByKey}, {"version", clientv3.SortByVersion},
		{"create", clientv3.SortByCreateRevision}, {"mod", clientv3.SortByModRevision},
		{"value", clientv3.SortByValue}}
	orders := []struct {
		name string
		o    clientv3.SortOrder
	}{{"none", clientv3.SortNone}, {"ascend", clientv3.SortAscend}, {"descend", clientv3.SortDescend}}
	checked := 0
	for _, tg := range targets {
		for _, od := range orders {
			for _, limit := range []int64{0, 1, 7, n + 5} {
				for _, keysOnly := range []bool{false, true} {
					cl := lc
					if checked%2 == 1 {
						cl = fc
					}
					checked++
					what := fmt.Sprintf("sort by %s %s limit %d keys-only %v", tg.name, od.name,
						limit, keysOnly)
					opts := []clientv3.OpOption{clientv3.WithPrefix(),
						clientv3.WithSort(tg.t, od.o), clientv3.WithLimit(limit)}
					if keysOnly {
						opts = append(opts, clientv3.WithKeysOnly())
					}
					g, err := cl.Get(c, pre, opts...)
					if err != nil {
						fail("%s: %v", what, err)
					}
					// etcd's: no order on a target other than the key sorts
					// ascending.
					o := od.o
					if o == clientv3.SortNone && tg.t != clientv3.SortByKey {
						o = clientv3.SortAscend
					}
					exp := append([]*mvccpb.KeyValue(nil), all.Kvs...)
					sort.SliceStable(exp, func(i, j int) bool {
						r := kvsemLess(tg.t, exp[i], exp[j])
						if o == clientv3.SortDescend {
							r = -r
						}
						return r < 0
					})
					wantN := int64(n)
					if limit > 0 && limit < n {
						wantN = limit
					}
					if int64(len(g.Kvs)) != wantN || g.Count != n || g.More != (wantN < n) {
						fail("%s: %d keys, count %d, more %v; want %d, %d, %v", what,
							len(g.Kvs), g.Count, g.More, wantN, n, wantN < n)
					}
					byKey := map[string]*mvccpb.KeyValue{}
					for _, kv := range all.Kvs {
						byKey[string(kv.Key)] = kv
					}
					for i, kv := range g.Kvs {
						full := byKey[string(kv.Key)]
						if full == nil || (keysOnly && len(kv.Value) != 0) ||
							(!keysOnly && !bytes.Equal(kv.Value, full.Value)) ||
							kv.Version != full.Version || kv.ModRevision != full.ModRevision {
							fail("%s: key %d %q=%q is not the one stored", what, i, kv.Key, kv.Value)
						}
						// Ties may come in any order (etcd's sort is not
						// stable either): the sorted target must match.
						if kvsemLess(tg.t, full, exp[i]) != 0 {
							fail("%s: key %d is %q (%+v), want %q (%+v)", what, i, kv.Key,
								full, exp[i].Key, exp[i])
						}
					}
				}
			}
		}
	}
	// count only, sorted: the count.
	g, err := fc.Get(c, pre, clientv3.WithPrefix(), clientv3.WithCountOnly(),
		clientv3.WithSort(clientv3.SortByValue, clientv3.SortDescend))
	if err != nil || g.Count != n || len(g.Kvs) != 0 {
		fail("count only, sorted: %v %+v", err, g)
	}
	ok("Range sorts: %d reads by key, version, create, mod and value, none/ascend/descend, limits 0, 1, 7 and past the range, keys only or not, via the leader and a follower, as a sort in Go", checked)

	// The bound: a sorted Range collects 8 MiB of keys (and values, when
	// sorted by them) at most; the values it answers are read after the sort.
	const bigN = 9
	big := strings.Repeat("b", 1<<20-100)
	bigKey := func(i int) string { return fmt.Sprintf("%sbig/%02d", kvsemPrefix, i) }
	for i := 0; i < bigN; i++ {
		if _, err := lc.Put(c, bigKey(i), big); err != nil {
			fail("Put 1 MiB: %v", err)
		}
	}
	for _, keysOnly := range []bool{false, true} {
		opts := []clientv3.OpOption{clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByValue, clientv3.SortDescend)}
		if keysOnly {
			opts = append(opts, clientv3.WithKeysOnly())
		}
		_, err = lc.Get(c, kvsemPrefix+"big/", opts...)
		if codeOf(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "sorted Range") {
			fail("a Range over %d MiB sorted by value (keys only %v): %v (want ResourceExhausted)",
				bigN, keysOnly, err)
		}
	}
	g, err = fc.Get(c, kvsemPrefix+"big/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend))
	if err != nil || len(g.Kvs) == 0 || len(g.Kvs) >= bigN || !g.More || g.Count != bigN ||
		string(g.Kvs[0].Key) != bigKey(bigN-1) || string(g.Kvs[0].Value) != big {
		fail("a Range over %d MiB sorted by mod revision: %v (want the last first, with its value, more)",
			bigN, err)
	}
	g, err = lc.Get(c, kvsemPrefix+"big/", clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend))
	if err != nil || len(g.Kvs) != bigN || string(g.Kvs[0].Key) != bigKey(bigN-1) {
		fail("the same sort, keys only: %v", err)
	}
	// One by one: a delete of them all would be one revision of 9 MiB of
	// previous values, a good part of what the change log holds.
	for i := 0; i < bigN; i++ {
		if _, err := lc.Delete(c, bigKey(i)); err != nil {
			fail("Delete: %v", err)
		}
	}
	if _, err := lc.Delete(c, kvsemPrefix, clientv3.WithPrefix()); err != nil {
		fail("Delete %s: %v", kvsemPrefix, err)
	}
	ok("a Range over %d MiB of values sorted by value: ResourceExhausted (keys only too); by mod revision: answered, its values read after the sort", bigN)
}

// Txn compares on LEASE and over a range (true when it holds for every key
// in the range; on an empty range as on a missing key).
func kvsemTxnCompares(lc, fc *clientv3.Client) {
	c, cancel := ctx()
	defer cancel()
	pre := kvsemPrefix + "t/"
	lg, err := lc.Grant(c, 60)
	if err != nil {
		fail("Grant: %v", err)
	}
	if _, err := lc.Put(c, pre+"a", "1", clientv3.WithLease(lg.ID)); err != nil {
		fail("Put: %v", err)
	}
	// In this order: "c" must be the last written (a map's order is random,
	// and with "b" after it the "mod <= the last" case failed a CI rehearsal).
	for _, kv := range [][2]string{{"b", "1"}, {"c", "2"}} {
		if _, err := lc.Put(c, pre+kv[0], kv[1]); err != nil {
			fail("Put: %v", err)
		}
	}
	last := kvsemStat(lc, pre+"c")
	cases := []struct {
		what string
		cmp  clientv3.Cmp
		want bool
	}{
		{"lease = the key's", clientv3.Compare(clientv3.LeaseValue(pre+"a"), "=", lg.ID), true},
		{"lease != the key's", clientv3.Compare(clientv3.LeaseValue(pre+"a"), "!=", lg.ID), false},
		{"lease of a key without one = 0", clientv3.Compare(clientv3.LeaseValue(pre+"b"), "=", 0), true},
		{"lease of a missing key = 0", clientv3.Compare(clientv3.LeaseValue(pre+"zz"), "=", 0), true},
		{"lease > 0 over the prefix", clientv3.Compare(clientv3.LeaseValue(pre).WithPrefix(), ">", 0), false},
		{"lease over [a, b)", clientv3.Compare(clientv3.LeaseValue(pre+"a").WithRange(pre+"b"), "=", lg.ID), true},
		{"value = 1 over [a, c)", clientv3.Compare(clientv3.Value(pre+"a").WithRange(pre+"c"), "=", "1"), true},
		{"value = 1 over the prefix", clientv3.Compare(clientv3.Value(pre).WithPrefix(), "=", "1"), false},
		{"version > 0 from b on", clientv3.Compare(clientv3.Version(pre+"b").WithRange("\x00"), ">", 0), true},
		{"value = 1 from b on", clientv3.Compare(clientv3.Value(pre+"b").WithRange("\x00"), "=", "1"), false},
		{"version > 0 over the prefix", clientv3.Compare(clientv3.Version(pre).WithPrefix(), ">", 0), true},
		{"mod <= the last over the prefix", clientv3.Compare(clientv3.ModRevision(pre).WithPrefix(), "<", last.ModRevision+1), true},
		{"create < the last over the prefix", clientv3.Compare(clientv3.CreateRevision(pre).WithPrefix(), "<", last.CreateRevision), false},
		{"version = 0 over an empty prefix", clientv3.Compare(clientv3.Version(pre+"none/").WithPrefix(), "=", 0), true},
		{"value != x over an empty prefix", clientv3.Compare(clientv3.Value(pre+"none/").WithPrefix(), "!=", "x"), false},
	}
	for i, tc := range cases {
		cl := lc
		if i%2 == 1 {
			cl = fc
		}
		r, err := cl.Txn(c).If(tc.cmp).Then(clientv3.OpPut(kvsemPrefix+"then", "1")).Commit()
		if err != nil || r.Succeeded != tc.want {
			fail("Txn compare %s: %v, succeeded %v, want %v", tc.what, err, r != nil && r.Succeeded, tc.want)
		}
	}
	if _, err := lc.Revoke(c, lg.ID); err != nil {
		fail("Revoke: %v", err)
	}
	if _, err := lc.Delete(c, kvsemPrefix, clientv3.WithPrefix()); err != nil {
		fail("Delete: %v", err)
	}
	ok("Txn compares: %d on LEASE and over ranges (prefix, [key, end), from key, empty), via the leader and a follower", len(cases))
}

// kvSemantics: prev_kv, ignore_value/ignore_lease, sorts, Txn compares on
// LEASE and over ranges (etcdapi_kv.c).
func kvSemantics(lc, fc *clientv3.Client) {
	kvsemPrevKV(lc, fc)
	kvsemIgnore(lc, fc)
	kvsemSorts(lc, fc)
	kvsemTxnCompares(lc, fc)
}
