package devcluster

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Fault injection beyond Stop, Restart, StepDown, Cut, Isolate and Heal:
// whole-cluster crash and restart, partitions into groups that routes
// gossiped around the proxies cannot leak through, isolating the leader of
// a stream. Partitions act on the routes only; client connections are not
// touched (put a proxy in front of a client to pause or cut it).

// StopAll stops every running node, keeping its data: a whole-cluster
// crash as far as JetStream is concerned (every node stores with
// sync_interval always, so acknowledged writes are on disk). The nodes
// stop concurrently, so no node sees the others leave one by one and
// elects itself with stale state.
func (c *Cluster) StopAll() {
	var wg sync.WaitGroup
	for i := 0; i < Size; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Stop(i)
		}()
	}
	wg.Wait()
}

// RestartAll starts every stopped node again on its ports and data and
// waits until JetStream is ready (a meta leader that sees every node).
// It returns the first error; nodes started before it keep running.
func (c *Cluster) RestartAll() error {
	for i := 0; i < Size; i++ {
		if c.Server(i) != nil {
			continue
		}
		if err := c.startNode(i); err != nil {
			return err
		}
	}
	return c.WaitReady()
}

// Running returns the indexes of the running nodes.
func (c *Cluster) Running() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, s := range c.servers {
		if s != nil {
			out = append(out, i)
		}
	}
	return out
}

// Partition cuts every route between nodes of different groups, both
// directions, and heals the routes within each group. The nodes named in
// no group form one more group together: Partition([]int{i}) isolates node
// i, Partition([]int{0}, []int{1}) leaves no two nodes connected.
//
// NATS route gossip can defeat the proxies: a node that hears of a peer
// through a third node, while it has no route to that peer, dials the
// peer's own cluster address (an implicit route), which no proxy carries.
// Partition therefore restarts (on its data) every node that holds such a
// route across the partition, until none is left, and fails if that does
// not converge. It returns the nodes it restarted.
func (c *Cluster) Partition(groups ...[]int) ([]int, error) {
	group := [Size]int{}
	for i := range group {
		group[i] = -1 // the rest
	}
	for g, members := range groups {
		for _, i := range members {
			group[i] = g
		}
	}
	for i := 0; i < Size; i++ {
		for j := 0; j < Size; j++ {
			if i != j {
				if group[i] != group[j] {
					c.proxies[i][j].Cut()
				} else {
					c.proxies[i][j].Heal()
				}
			}
		}
	}
	// A gossiped dial may still be in flight, and route pools add their
	// connections after the first one: watch for a quiet second.
	var restarted []int
	quiet := time.Now().Add(time.Second)
	for time.Now().Before(quiet) {
		leak := -1
		for _, b := range c.Bypasses() {
			if group[b[0]] != group[b[1]] {
				leak = b[0]
				break
			}
		}
		if leak < 0 {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if len(restarted) >= 2*Size {
			return restarted, fmt.Errorf("devcluster: routes bypassing the proxies keep coming back: %v", c.Bypasses())
		}
		c.Stop(leak)
		if err := c.startNode(leak); err != nil {
			return restarted, err
		}
		restarted = append(restarted, leak)
		quiet = time.Now().Add(time.Second)
	}
	return restarted, nil
}

// Bypasses returns the route connections that do not pass through a proxy,
// as pairs {from, to}: from dialled to's cluster address directly (see
// Partition). Cut and Isolate cannot cut them.
func (c *Cluster) Bypasses() [][2]int {
	c.mu.Lock()
	ports := c.routePorts
	c.mu.Unlock()
	var out [][2]int
	for i := 0; i < Size; i++ {
		s := c.Server(i)
		if s == nil {
			continue
		}
		rz, err := s.Routez(&server.RoutezOptions{})
		if err != nil {
			continue
		}
		for _, r := range rz.Routes {
			if !r.DidSolicit {
				continue
			}
			for j, p := range ports {
				if j != i && r.Port == p {
					out = append(out, [2]int{i, j})
				}
			}
		}
	}
	return out
}

// IsolateStreamLeader isolates the node that leads stream, as Partition
// does, and returns its index; the other two nodes keep a quorum and elect
// a new leader. It fails when no running node leads the stream.
func (c *Cluster) IsolateStreamLeader(stream string) (int, error) {
	l := c.StreamLeader(stream)
	if l < 0 {
		return -1, fmt.Errorf("devcluster: stream %s has no leader", stream)
	}
	_, err := c.Partition([]int{l})
	return l, err
}

// WaitStreamLeader waits until a running node other than those in not
// leads stream, and returns its index. An isolated old leader may still
// believe it leads for a while; naming it in not skips it. It gives up
// after timeout.
func (c *Cluster) WaitStreamLeader(stream string, timeout time.Duration, not ...int) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		for i := 0; i < Size; i++ {
			if slices.Contains(not, i) {
				continue
			}
			if s := c.Server(i); s != nil && s.JetStreamIsStreamLeader(Account, stream) {
				return i, nil
			}
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("devcluster: stream %s got no leader outside %v in %v", stream, not, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
