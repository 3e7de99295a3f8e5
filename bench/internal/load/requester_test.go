package load

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// A request stays in flight until its callback has returned: Drain, which
// waits for InFlight to reach 0, must find what the callback recorded. (A
// warm-up whose last grant was recorded after Drain returned sent one
// acquire too many.)
func TestAReplyIsInFlightUntilItsCallbackReturns(t *testing.T) {
	r := &Requester{pending: map[uint64]*call{}}
	entered, release := make(chan struct{}), make(chan struct{})
	r.pending[1] = &call{timer: time.NewTimer(time.Hour), done: func(*nats.Msg, time.Time, error) {
		close(entered)
		<-release
	}}
	r.inflight.Add(1)
	finished := make(chan struct{})
	go func() {
		r.finish(1, &nats.Msg{}, time.Now(), nil)
		close(finished)
	}()
	<-entered
	if n := r.InFlight(); n != 1 {
		t.Fatalf("in flight while its callback runs: %d, want 1", n)
	}
	close(release)
	<-finished
	if n := r.InFlight(); n != 0 {
		t.Fatalf("in flight after its callback: %d, want 0", n)
	}
}
