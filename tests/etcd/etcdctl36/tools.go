//go:build tools

// Package tools pins etcd's etcdctl v3.6.16 in this module, so that
// `go build go.etcd.io/etcd/etcdctl/v3` here builds that version from the Go
// module proxy (tests/etcd/etcdctl_test.py --build-etcdctl36). Never part
// of the server.
package tools

import _ "go.etcd.io/etcd/etcdctl/v3"
