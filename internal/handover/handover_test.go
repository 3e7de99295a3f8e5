package handover

import (
	"testing"
	"time"

	"github.com/nats-io/jsm.go/api"
)

// The successor is a current replica, the one that lags least, and of
// those the one heard from last; a replica that is behind or offline is
// never chosen, even when it is the only other one.
func TestSuccessor(t *testing.T) {
	peer := func(name string, current, offline bool, lag uint64, active time.Duration) *api.PeerInfo {
		return &api.PeerInfo{Name: name, Current: current, Offline: offline, Lag: lag, Active: active}
	}
	for _, tc := range []struct {
		name     string
		replicas []*api.PeerInfo
		want     string
	}{
		{"none", nil, ""},
		{"behind", []*api.PeerInfo{peer("b", false, false, 0, time.Millisecond)}, ""},
		{"offline", []*api.PeerInfo{peer("b", true, true, 0, time.Millisecond)}, ""},
		{"the current one", []*api.PeerInfo{peer("b", false, false, 0, time.Millisecond), peer("c", true, false, 9, time.Second)}, "c"},
		{"least lag", []*api.PeerInfo{peer("b", true, false, 5, time.Millisecond), peer("c", true, false, 1, time.Second)}, "c"},
		{"heard from last", []*api.PeerInfo{peer("b", true, false, 0, 30*time.Millisecond), peer("c", true, false, 0, 2*time.Millisecond)}, "c"},
		{"a nil entry", []*api.PeerInfo{nil, peer("c", true, false, 0, 0)}, "c"},
	} {
		if got := Successor(tc.replicas); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
