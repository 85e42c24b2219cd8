// clientbench: a load generator over etcd's own Go client (clientv3,
// go.etcd.io/etcd/client/v3 v3.6.16), for the same rows `tierkv bench` runs
// over HTTP: N concurrent clients, each waiting for its answer before the next
// request, over a few gRPC connections spread on the endpoints. Run against
// etcd or against tierkvd's --listen-client (etcdapi/) by
// scripts/bench-http.sh (BENCH_CLIENTV3=1).
//
//	clientbench -endpoints H:P,H:P,H:P -clients 64 -d 5s -warmup 1s \
//	    -value-size 64 -keys 10000 -mix put|get|sget [-conns N] \
//	    [-cpu-pids PID,PID,...] [-no-prefill] [-json]
//
// -mix: put (Put), get (linearizable Range of one key), sget (serializable
// Range), or a read fraction 0..1 (linearizable gets, the rest puts). Keys are
// "bench/%08d" (as tierkv bench), uniform. Latencies go into a bounded log
// histogram (1 % buckets). -cpu-pids: utime + stime of each process from
// /proc/PID/stat over the measured window (as `tierkv bench --cpu-pids`,
// cmd/tierkv/bench_cpu.c), per op. Prints a summary and one JSON line
// ("bench":"clientv3", the field names of tierkv bench's line). Exit 0 when
// the window had ops and no errors, 1 otherwise, 2 on bad flags.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Linux reports utime and stime in clock ticks of USER_HZ, 100 on every
// architecture Go runs on there (sysconf(_SC_CLK_TCK) needs cgo).
const clkTck = 100

// The histogram: bucket i holds latencies in [base^i, base^(i+1)) us.
const (
	histBase    = 1.01
	histBuckets = 2200 // 1.01^2200 us is about 3e9 s: everything fits
)

type hist [histBuckets]uint64

func bucketOf(us float64) int {
	if us < 1 {
		return 0
	}
	b := int(math.Log(us) / math.Log(histBase))
	if b >= histBuckets {
		b = histBuckets - 1
	}
	return b
}

// The q-quantile in ms: the bucket's geometric middle.
func (h *hist) quantile(q float64, n uint64) float64 {
	if n == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(n)))
	if want == 0 {
		want = 1
	}
	var seen uint64
	for i := range h {
		seen += h[i]
		if seen >= want {
			return math.Pow(histBase, float64(i)+0.5) / 1000
		}
	}
	return math.Pow(histBase, histBuckets) / 1000
}

func cpuUs(pid string) int64 {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return -1
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return -1
	}
	ut, e1 := strconv.ParseUint(f[11], 10, 64)
	st, e2 := strconv.ParseUint(f[12], 10, 64)
	if e1 != nil || e2 != nil {
		return -1
	}
	return int64((ut + st) * 1000000 / clkTck)
}

type worker struct {
	h      hist
	ops    uint64
	errs   uint64
	maxUs  float64
	lastEr string
}

func main() {
	eps := flag.String("endpoints", "127.0.0.1:2379", "comma-separated HOST:PORT list")
	clients := flag.Int("clients", 64, "concurrent clients (each one request at a time)")
	conns := flag.Int("conns", 0, "gRPC connections, spread on the endpoints (0: one per endpoint)")
	dur := flag.Duration("d", 5*time.Second, "measured duration")
	warm := flag.Duration("warmup", time.Second, "warm-up before the measured window")
	vsize := flag.Int("value-size", 64, "value size in bytes")
	keys := flag.Int("keys", 10000, "distinct keys (uniform)")
	mix := flag.String("mix", "put", "put, get (linearizable), sget (serializable) or a read fraction 0..1")
	cpuPids := flag.String("cpu-pids", "", "comma-separated pids whose CPU per op to report")
	noPrefill := flag.Bool("no-prefill", false, "do not write every key once before reads")
	jsonOnly := flag.Bool("json", false, "print only the JSON line")
	timeout := flag.Duration("timeout", 10*time.Second, "per-request timeout")
	flag.Parse()

	readFrac, serializable, op := 0.0, false, "put"
	switch *mix {
	case "put", "write":
	case "get", "read":
		readFrac, op = 1, "get"
	case "sget":
		readFrac, serializable, op = 1, true, "sget"
	default:
		v, err := strconv.ParseFloat(*mix, 64)
		if err != nil || v < 0 || v > 1 {
			fmt.Fprintf(os.Stderr, "clientbench: bad -mix %q\n", *mix)
			os.Exit(2)
		}
		readFrac, op = v, "mix"
		if v == 0 {
			op = "put"
		} else if v == 1 {
			op = "get"
		}
	}
	epList := strings.Split(*eps, ",")
	if *clients < 1 || *clients > 100000 || *keys < 1 || *vsize < 0 || *vsize > 1<<20 ||
		*dur <= 0 || *warm < 0 || len(epList) == 0 || epList[0] == "" {
		fmt.Fprintln(os.Stderr, "clientbench: bad flags (clients 1..100000, keys >= 1, value-size 0..1 MiB, d > 0)")
		os.Exit(2)
	}
	nconn := *conns
	if nconn <= 0 {
		nconn = len(epList)
	}
	var pids []string
	if *cpuPids != "" {
		pids = strings.Split(*cpuPids, ",")
		for _, p := range pids {
			if n, err := strconv.Atoi(p); err != nil || n <= 0 {
				fmt.Fprintf(os.Stderr, "clientbench: bad -cpu-pids %q\n", *cpuPids)
				os.Exit(2)
			}
		}
	}

	cs := make([]*clientv3.Client, nconn)
	for i := range cs {
		c, err := clientv3.New(clientv3.Config{
			Endpoints:   []string{epList[i%len(epList)]},
			DialTimeout: 5 * time.Second,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "clientbench: %s: %v\n", epList[i%len(epList)], err)
			os.Exit(1)
		}
		defer c.Close()
		cs[i] = c
	}
	val := make([]byte, *vsize)
	for i := range val {
		val[i] = byte('a' + i%26)
	}
	value := string(val)
	key := func(k int) string { return fmt.Sprintf("bench/%08d", k) }

	// The prefill: every key written once (when the mix reads), by all clients.
	if readFrac > 0 && !*noPrefill {
		var next, perr atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < *clients; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				c := cs[w%nconn]
				for {
					k := int(next.Add(1) - 1)
					if k >= *keys || perr.Load() > 100 {
						return
					}
					ctx, cancel := context.WithTimeout(context.Background(), *timeout)
					if _, err := c.Put(ctx, key(k), value); err != nil {
						perr.Add(1)
					}
					cancel()
				}
			}(w)
		}
		wg.Wait()
		if perr.Load() > 0 {
			fmt.Fprintf(os.Stderr, "clientbench: prefill: %d errors\n", perr.Load())
			os.Exit(1)
		}
	}

	start := time.Now()
	t0 := start.Add(*warm)
	t1 := t0.Add(*dur)
	ws := make([]*worker, *clients)
	var wg sync.WaitGroup
	for w := 0; w < *clients; w++ {
		ws[w] = &worker{}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			me := ws[w]
			c := cs[w%nconn]
			rng := rand.New(rand.NewSource(int64(w) + 1))
			for {
				now := time.Now()
				if !now.Before(t1) {
					return
				}
				k := key(rng.Intn(*keys))
				ctx, cancel := context.WithTimeout(context.Background(), *timeout)
				var err error
				if readFrac > 0 && (readFrac >= 1 || rng.Float64() < readFrac) {
					if serializable {
						_, err = c.Get(ctx, k, clientv3.WithSerializable())
					} else {
						_, err = c.Get(ctx, k)
					}
				} else {
					_, err = c.Put(ctx, k, value)
				}
				cancel()
				end := time.Now()
				if now.Before(t0) || end.After(t1) {
					continue
				}
				if err != nil {
					me.errs++
					me.lastEr = err.Error()
					continue
				}
				us := float64(end.Sub(now).Nanoseconds()) / 1000
				me.h[bucketOf(us)]++
				me.ops++
				if us > me.maxUs {
					me.maxUs = us
				}
			}
		}(w)
	}
	// CPU at the window's edges: the servers' and this process's own.
	cpu0 := make([]int64, len(pids))
	cpu1 := make([]int64, len(pids))
	time.Sleep(time.Until(t0))
	for i, p := range pids {
		cpu0[i] = cpuUs(p)
	}
	self0 := cpuUs("self")
	time.Sleep(time.Until(t1))
	for i, p := range pids {
		cpu1[i] = cpuUs(p)
	}
	self1 := cpuUs("self")
	wg.Wait()

	var all hist
	var ops, errs uint64
	maxUs, lastEr := 0.0, ""
	for _, w := range ws {
		for i := range w.h {
			all[i] += w.h[i]
		}
		ops += w.ops
		errs += w.errs
		if w.maxUs > maxUs {
			maxUs = w.maxUs
		}
		if w.lastEr != "" {
			lastEr = w.lastEr
		}
	}
	secs := dur.Seconds()
	perOp := func(d int64) float64 {
		if ops == 0 || d < 0 {
			return -1
		}
		return float64(d) / float64(ops)
	}
	cpuEach := make([]float64, len(pids))
	cpuTotal := 0.0
	for i := range pids {
		if cpu0[i] < 0 || cpu1[i] < 0 {
			cpuEach[i], cpuTotal = -1, -1
			continue
		}
		cpuEach[i] = perOp(cpu1[i] - cpu0[i])
		if cpuTotal >= 0 {
			cpuTotal += cpuEach[i]
		}
	}
	if len(pids) == 0 {
		cpuTotal = -1
	}
	consistency := "linearizable"
	if serializable {
		consistency = "serializable"
	}
	res := map[string]any{
		"bench": "clientv3", "protocol": "etcd-grpc", "op": op, "read_fraction": readFrac,
		"connections": *clients, "clients": *clients, "grpc_conns": nconn,
		"duration_s": secs, "value_size": *vsize, "keys": *keys, "runs": 1,
		"ops": ops, "ops_per_s": float64(ops) / secs,
		"p50_ms": all.quantile(0.50, ops), "p90_ms": all.quantile(0.90, ops),
		"p99_ms": all.quantile(0.99, ops), "p999_ms": all.quantile(0.999, ops),
		"max_ms": maxUs / 1000, "errors": errs,
		"cpu_us_per_op": cpuEach, "cpu_us_per_op_total": cpuTotal,
		"bench_cpu_us_per_op": perOp(self1 - self0),
		"consistency":         consistency, "endpoints": *eps,
	}
	line, _ := json.Marshal(res)
	if !*jsonOnly {
		fmt.Printf("clientv3 %s: %d clients over %d gRPC connections, %s measured: %d ops, "+
			"%.0f ops/s, p50 %.3f ms, p99 %.3f ms, max %.3f ms, %d errors\n",
			op, *clients, nconn, *dur, ops, float64(ops)/secs, all.quantile(0.5, ops),
			all.quantile(0.99, ops), maxUs/1000, errs)
		if cpuTotal >= 0 {
			fmt.Printf("server CPU us per op: %v (total %.1f)\n", cpuEach, cpuTotal)
		}
	}
	fmt.Println(string(line))
	if errs > 0 {
		fmt.Fprintf(os.Stderr, "clientbench: %d errors (last: %s)\n", errs, lastEr)
	}
	if ops == 0 {
		fmt.Fprintf(os.Stderr, "clientbench: no request completed in the measured window\n")
	}
	if ops == 0 || errs > 0 {
		os.Exit(1)
	}
}
