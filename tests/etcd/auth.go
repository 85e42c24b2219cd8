// The auth mode: clientv3 against a --listen-client whose node has an
// --auth-file (etcdapi_auth.c): etcd's Authenticate (name and the user's
// token as its password) and the token on every call. Run by
// etcd_auth_test.py, which writes the file with three users: "root"
// (admin), "app" (write:/app/) and "ro" (read:/app/), their tokens passed
// here.
//
//	etcd-client -mode auth -target HOST:PORT -root-token T -app-token T -ro-token T
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

var (
	authRoot = flag.String("root-token", "", "auth: the admin's token")
	authApp  = flag.String("app-token", "", "auth: the token of app (write:/app/)")
	authRO   = flag.String("ro-token", "", "auth: the token of ro (read:/app/)")
)

func authClient(ep, user, password string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   []string{ep},
		DialTimeout: 10 * time.Second,
		Username:    user,
		Password:    password,
		Logger:      zap.NewNop(),
	})
}

func mustAuthClient(ep, user, password string) *clientv3.Client {
	c, err := authClient(ep, user, password)
	if err != nil {
		fail("dial %s as %s: %v", ep, user, err)
	}
	return c
}

func wantCode(what string, err error, code codes.Code, want error) {
	if err == nil {
		fail("%s: accepted, want %v", what, want)
	}
	if codeOf(err) != code || !errors.Is(err, want) && err.Error() != want.Error() {
		fail("%s: %v (code %v), want %v", what, err, codeOf(err), want)
	}
	ok("%s: %v", what, err)
}

func authMode(ep string) {
	cx, cancel := ctx()
	defer cancel()

	anon := client(ep)
	_, err := anon.Put(cx, "/app/anon", "x")
	wantCode("a Put without a token", err, codes.InvalidArgument, rpctypes.ErrUserEmpty)
	bad := metadata.AppendToOutgoingContext(cx, "token", "not-a-token")
	_, err = anon.Get(bad, "/app/anon")
	wantCode("a Get with an unknown token", err, codes.Unauthenticated,
		rpctypes.ErrInvalidAuthToken)
	direct := metadata.AppendToOutgoingContext(cx, "token", *authApp)
	if _, err := anon.Put(direct, "/app/direct", "token sent directly"); err != nil {
		fail("a Put with app's token as metadata: %v", err)
	}
	anon.Close()
	ok("a token sent as metadata without Authenticate is taken")

	if _, err := authClient(ep, "app", "wrong"); err == nil {
		fail("Authenticate with a wrong password succeeded")
	} else if !errors.Is(err, rpctypes.ErrAuthFailed) && codeOf(err) != codes.InvalidArgument {
		fail("Authenticate with a wrong password: %v", err)
	}
	if _, err := authClient(ep, "ro", *authApp); err == nil {
		fail("Authenticate with another user's token succeeded")
	}
	ok("Authenticate refuses a wrong password and another user's token")

	app := mustAuthClient(ep, "app", *authApp)
	defer app.Close()
	wch := app.Watch(cx, "/app/", clientv3.WithPrefix())
	put, err := app.Put(cx, "/app/k", "v")
	if err != nil {
		fail("app's Put /app/k: %v", err)
	}
	select {
	case wr := <-wch:
		if wr.Err() != nil || len(wr.Events) != 1 ||
			wr.Events[0].Kv.ModRevision != put.Header.Revision {
			fail("app's watch of /app/: %v %+v", wr.Err(), wr.Events)
		}
	case <-time.After(10 * time.Second):
		fail("app's watch of /app/: no event in 10 s")
	}
	if g, err := app.Get(cx, "/app/", clientv3.WithPrefix()); err != nil || g.Count != 2 {
		fail("app's Get /app/ prefix: %v %v", err, g)
	}
	if _, err := app.Grant(cx, 30); err != nil {
		fail("app's LeaseGrant: %v", err)
	}
	if _, err := app.MemberList(cx); err != nil {
		fail("app's MemberList: %v", err)
	}
	ok("app (write:/app/): Put, a watch event, Get, LeaseGrant, MemberList")
	_, err = app.Put(cx, "/other", "v")
	wantCode("app's Put /other", err, codes.PermissionDenied, rpctypes.ErrPermissionDenied)
	_, err = app.Get(cx, "", clientv3.WithFromKey())
	wantCode("app's Get of every key", err, codes.PermissionDenied,
		rpctypes.ErrPermissionDenied)
	_, err = app.Txn(cx).If(clientv3.Compare(clientv3.Version("/app/k"), ">", 0)).
		Then(clientv3.OpPut("/other", "v")).Commit()
	wantCode("app's Txn writing /other", err, codes.PermissionDenied,
		rpctypes.ErrPermissionDenied)
	_, err = app.MemberAdd(cx, []string{"http://127.0.0.1:1"})
	wantCode("app's MemberAdd", err, codes.PermissionDenied, rpctypes.ErrPermissionDenied)
	_, err = app.Compact(cx, 1)
	wantCode("app's Compact", err, codes.PermissionDenied, rpctypes.ErrPermissionDenied)
	wctx, wcancel := context.WithTimeout(cx, 10*time.Second)
	wr, open := <-app.Watch(wctx, "/other")
	wcancel()
	if !open || wr.Err() == nil || !wr.Canceled {
		fail("app's watch of /other: open %v, %v %+v", open, wr.Err(), wr)
	}
	ok("app's watch of /other: canceled: %v", wr.Err())
	if rc, err := app.Snapshot(cx); err == nil {
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
		wantCode("app's Snapshot", err, codes.PermissionDenied, rpctypes.ErrPermissionDenied)
	} else {
		wantCode("app's Snapshot", err, codes.PermissionDenied, rpctypes.ErrPermissionDenied)
	}

	ro := mustAuthClient(ep, "ro", *authRO)
	defer ro.Close()
	if g, err := ro.Get(cx, "/app/k"); err != nil || len(g.Kvs) != 1 {
		fail("ro's Get /app/k: %v %v", err, g)
	}
	_, err = ro.Put(cx, "/app/k", "w")
	wantCode("ro's Put /app/k", err, codes.PermissionDenied, rpctypes.ErrPermissionDenied)
	_, err = ro.Delete(cx, "/app/", clientv3.WithPrefix())
	wantCode("ro's Delete /app/ prefix", err, codes.PermissionDenied,
		rpctypes.ErrPermissionDenied)

	root := mustAuthClient(ep, "root", *authRoot)
	defer root.Close()
	if _, err := root.Put(cx, "/other", "by root"); err != nil {
		fail("root's Put /other: %v", err)
	}
	if _, err := root.Compact(cx, put.Header.Revision); err != nil {
		fail("root's Compact: %v", err)
	}
	if _, err := root.Status(cx, ep); err != nil {
		fail("root's Status: %v", err)
	}
	rc, err := root.Snapshot(cx)
	if err != nil {
		fail("root's Snapshot: %v", err)
	}
	n, err := io.Copy(io.Discard, rc)
	rc.Close()
	if err != nil || n == 0 {
		fail("root's Snapshot: %d bytes, %v", n, err)
	}
	ok("root (admin): Put anywhere, Compact, Status, Snapshot (%d bytes)", n)
}
