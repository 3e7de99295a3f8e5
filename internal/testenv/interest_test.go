package testenv_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// A caller's subscription to election events is unknown to the service's
// account before it subscribes; once WaitInterest returns, an event the
// service publishes through any node reaches it.
func TestWaitInterestCoversEveryNode(t *testing.T) {
	env := testenv.Start(t)
	subject := streams.EventSubject(streams.DefaultPrefix, "interest/1")
	for i := range devcluster.Size {
		acc, err := env.Cluster.Server(i).LookupAccount(devcluster.Account)
		if err != nil {
			t.Fatal(err)
		}
		if acc.SubscriptionInterest(subject) {
			t.Fatalf("node %d knows of interest in %s before anybody subscribed", i, subject)
		}
	}
	obs := env.Connect()
	got := make(chan *nats.Msg, devcluster.Size)
	if _, err := obs.ChanSubscribe(subject, got); err != nil {
		t.Fatal(err)
	}
	env.WaitInterest(devcluster.Account, subject)
	for i := range devcluster.Size {
		nc, err := nats.Connect(env.Cluster.ClientURL(i), env.Cluster.ConnectOptions(devcluster.Service)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(subject, []byte{byte('0' + i)}); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		nc.Close()
		select {
		case m := <-got:
			if string(m.Data) != string(rune('0'+i)) {
				t.Fatalf("through node %d: got %q", i, m.Data)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("an event published through node %d did not arrive", i)
		}
	}
}
