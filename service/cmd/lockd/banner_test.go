package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/client/fence"
)

var appLine = regexp.MustCompile(`(?s)An application with JetStream.*?user "([^"]+)", password "([^"]+)"`)

// The --dev banner gives what a newcomer needs to try client/fence.NewKV:
// the application user, which takes leases like a caller and has
// JetStream in an account of its own (callers and the operator have none).
func TestDevBannerAppUserCanFence(t *testing.T) {
	ports := freePorts(t, 3)
	l := startLockd(t, "--dev", "--dev-dir", t.TempDir(), "--dev-ports", fmt.Sprintf("%d,%d,%d", ports[0], ports[1], ports[2]))
	m := appLine.FindStringSubmatch(l.stdout.String())
	if m == nil {
		t.Fatalf("the banner names no application user:\n%s", l.stdout.String())
	}
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", ports[0]), nats.UserInfo(m[1], m[2]))
	if err != nil {
		t.Fatalf("connect as the banner's application user: %v", err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "fences", Replicas: 3})
	if err != nil {
		t.Fatalf("the application user cannot make a KV bucket: %v", err)
	}
	guard, err := fence.NewKV(kv)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	first, err := cl.TryAcquire(ctx, "orders/1", client.TTL(2*time.Second))
	if err != nil {
		t.Fatalf("the application user cannot acquire: %v", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := cl.TryAcquire(ctx, "orders/1")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctx)
	if _, err := guard.Put(ctx, "orders/1", second.Token(), []byte("new")); err != nil {
		t.Fatalf("fenced write with the current token: %v", err)
	}
	if _, err := guard.Put(ctx, "orders/1", first.Token(), []byte("stale")); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("fenced write with the old token: %v, want fence.ErrStaleToken", err)
	}
}
