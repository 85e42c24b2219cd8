// The tls mode: clientv3 over TLS against a --listen-client that serves
// tierkvd's --cert-file (ALPN h2) and requires client certificates
// (--client-ca-file), as etcd's --cert-file/--trusted-ca-file/
// --client-cert-auth do. Run by etcd_tls_test.py.
//
//	etcd-client -mode tls -target HOST:PORT -cacert CA -cert CERT -key KEY
//	    [-other-cert CERT -other-key KEY]
//
// With the trusted client certificate: Put, Get, a watch that sees a put,
// a lease. Refused: no client certificate, the -other-cert one (another
// CA), a client that does not trust the server's CA, and cleartext h2c.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

var (
	tlsCA        = flag.String("cacert", "", "tls: the server's CA (PEM)")
	tlsCert      = flag.String("cert", "", "tls: the client certificate (PEM)")
	tlsKey       = flag.String("key", "", "tls: its key (PEM)")
	tlsOtherCert = flag.String("other-cert", "", "tls: a client certificate of another CA")
	tlsOtherKey  = flag.String("other-key", "", "tls: its key")
)

func tlsConfig(ca, cert, key string) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			fail("read %s: %v", ca, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fail("no certificate in %s", ca)
		}
		cfg.RootCAs = pool
	}
	if cert != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			fail("load %s: %v", cert, err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return cfg
}

// A client that fails fast: a refused handshake must show as an error of
// the first call, not as a dial that waits.
func tlsClient(ep string, cfg *tls.Config, wait time.Duration) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{ep},
		DialTimeout: wait,
		TLS:         cfg,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithBlock()},
	})
	if err != nil {
		return nil
	}
	return c
}

// Must the call fail? A refused client either cannot dial or fails its Put.
func tlsRefused(what, ep string, cfg *tls.Config, insecure bool) {
	var c *clientv3.Client
	if insecure {
		c = client(ep) // main.go's: cleartext h2c
	} else {
		c = tlsClient(ep, cfg, 3*time.Second)
	}
	if c == nil {
		ok("%s: refused (the dial failed)", what)
		return
	}
	defer c.Close()
	cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Put(cx, "/tls/refused", what); err == nil {
		fail("%s: a Put was accepted", what)
	} else {
		ok("%s: refused: %v", what, err)
	}
}

func tlsMode(ep string) {
	good := tlsConfig(*tlsCA, *tlsCert, *tlsKey)
	c := tlsClient(ep, good, 10*time.Second)
	if c == nil {
		fail("the trusted client certificate could not dial %s", ep)
	}
	defer c.Close()
	cx, cancel := ctx()
	defer cancel()
	wch := c.Watch(clientv3.WithRequireLeader(cx), "/tls/", clientv3.WithPrefix())
	put, err := c.Put(cx, "/tls/a", "over TLS")
	if err != nil {
		fail("Put over TLS: %v", err)
	}
	got, err := c.Get(cx, "/tls/a")
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "over TLS" {
		fail("Get over TLS: %v %v", err, got)
	}
	select {
	case wr := <-wch:
		if wr.Err() != nil || len(wr.Events) != 1 ||
			wr.Events[0].Kv.ModRevision != put.Header.Revision {
			fail("watch over TLS: %v %+v", wr.Err(), wr.Events)
		}
	case <-time.After(10 * time.Second):
		fail("watch over TLS: no event in 10 s")
	}
	lg, err := c.Grant(cx, 30)
	if err != nil || lg.TTL != 30 {
		fail("LeaseGrant over TLS: %v %v", err, lg)
	}
	ok("a trusted client certificate: Put, Get, a watch event, a lease (revision %d)",
		put.Header.Revision)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ml, err := c.MemberList(cx)
		if err == nil && len(ml.Members) == 1 && len(ml.Members[0].ClientURLs) == 1 &&
			ml.Members[0].ClientURLs[0] == "https://"+ep {
			break
		}
		if time.Now().After(deadline) {
			fail("MemberList over TLS: %v %+v, want the client URL https://%s", err, ml, ep)
		}
	}
	ok("MemberList names the client URL https://%s", ep)

	tlsRefused("no client certificate", ep, tlsConfig(*tlsCA, "", ""), false)
	if *tlsOtherCert != "" {
		tlsRefused("a client certificate of another CA", ep,
			tlsConfig(*tlsCA, *tlsOtherCert, *tlsOtherKey), false)
	}
	// Trusting nothing but the system's store: the server's test CA is
	// unknown to it.
	tlsRefused("a client that does not trust the server's CA", ep,
		tlsConfig("", *tlsCert, *tlsKey), false)
	tlsRefused("cleartext h2c against the TLS port", ep, nil, true)
}
