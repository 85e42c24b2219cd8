// etcd36: etcd's own server (go.etcd.io/etcd/server/v3 v3.6.16, from the Go
// module proxy) as one binary, for scripts/bench-http.sh's comparison with
// BENCH_ETCD36=1. `go install go.etcd.io/etcd/v3@v3.6.16` refuses the
// replace directives of etcd's main module, so this tiny main module
// requires the server module and calls the same entry point etcd's main does.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
