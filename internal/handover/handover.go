// Package handover moves the leadership of the lock bucket's stream off a
// NATS server that is about to stop, to the replica that is most current,
// and waits until that replica leads.
//
// nats-server hands its streams over by itself when it stops in lame duck
// mode or on SIGTERM, but to the first peer it has heard from lately,
// whether or not that peer has caught up: under load, after a rolling
// restart has just brought a node back, the chosen peer may be behind,
// fail to take over, and leave the stream without a leader until
// JetStream stops a second later. Asked first, with the current peer
// named, the stream changes leader at once; the server's own step-down
// then finds nothing of the bucket's to hand over.
package handover

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go"
)

// Result is what Move did.
type Result struct {
	// Leader is the server that led the stream when Move looked.
	Leader string `json:"leader"`
	// NewLeader is the server that leads it after the hand-over; empty
	// when from did not lead the stream (nothing was done).
	NewLeader string `json:"new_leader,omitempty"`
	// Took is how long the hand-over took, from the request to the new
	// leader's first answer.
	Took time.Duration `json:"took_ns,omitempty"`
}

// pollTimeout bounds each stream info of the wait for the new leader.
const pollTimeout = 250 * time.Millisecond

// ErrNoCurrentPeer: no replica other than the leader is current, and a
// step-down would leave the stream without a leader until one catches up.
var ErrNoCurrentPeer = errors.New("no other replica of the stream is current")

// Move hands the leadership of stream over when server from leads it: to
// the current replica that lags least, and waits until another server
// leads, at most until ctx ends. nc needs the JetStream API of the
// stream's account: stream info and leader step-down.
func Move(ctx context.Context, nc *nats.Conn, stream, from string) (Result, error) {
	// Each request is bounded apart from ctx: a stream info sent while
	// the leadership moves may go unanswered, and the next one is sent.
	timeout := 2 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, time.Until(dl)), time.Millisecond)
	}
	mgr, err := jsm.New(nc, jsm.WithTimeout(timeout))
	if err != nil {
		return Result{}, err
	}
	s, err := mgr.LoadStream(stream)
	if err != nil {
		return Result{}, fmt.Errorf("stream %s: %w", stream, err)
	}
	ci, err := clusterInfo(s)
	if err != nil {
		return Result{}, fmt.Errorf("stream %s: %w", stream, err)
	}
	res := Result{Leader: ci.Leader}
	if ci.Leader != from {
		return res, nil
	}
	to := Successor(ci.Replicas)
	if to == "" {
		return res, ErrNoCurrentPeer
	}
	// While the leadership moves, a stream info may go unanswered: the
	// wait asks with a short timeout, and again.
	poll, err := jsm.New(nc, jsm.WithTimeout(min(timeout, pollTimeout)))
	if err != nil {
		return res, err
	}
	ps, err := poll.LoadStream(stream)
	if err != nil {
		return res, fmt.Errorf("stream %s: %w", stream, err)
	}
	start := time.Now()
	if err := s.LeaderStepDown(&api.Placement{Preferred: to}); err != nil {
		return res, fmt.Errorf("step down in favour of %s: %w", to, err)
	}
	for {
		ci, err := clusterInfo(ps)
		if err == nil && ci.Leader != "" && ci.Leader != from {
			res.NewLeader, res.Took = ci.Leader, time.Since(start)
			return res, nil
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("no new leader of %s after %v: %w", stream, time.Since(start).Round(time.Millisecond), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// clusterInfo asks for the stream's cluster information afresh (jsm.go's
// ClusterInfo answers from the last one it loaded).
func clusterInfo(s *jsm.Stream) (*api.ClusterInfo, error) {
	info, err := s.Information()
	if err != nil {
		return nil, err
	}
	if info.Cluster == nil {
		return nil, fmt.Errorf("stream %s is not clustered", s.Name())
	}
	return info.Cluster, nil
}

// Successor is the replica that should lead after the leader: the current
// one (neither offline nor behind) that lags least, and of those the one
// heard from last; "" when none is current.
func Successor(replicas []*api.PeerInfo) string {
	var best *api.PeerInfo
	for _, p := range replicas {
		if p == nil || !p.Current || p.Offline {
			continue
		}
		if best == nil || p.Lag < best.Lag || p.Lag == best.Lag && p.Active < best.Active {
			best = p
		}
	}
	if best == nil {
		return ""
	}
	return best.Name
}
