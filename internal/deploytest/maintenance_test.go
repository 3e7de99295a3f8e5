package deploytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/testenv"
)

// bucketAccount is the account of accounts.conf that holds the bucket.
const bucketAccount = "JETLOCK"

// serverLog keeps a server's log lines. It is safe for concurrent use.
type serverLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *serverLog) add(format string, v ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
	l.mu.Unlock()
}

func (l *serverLog) Noticef(format string, v ...any) { l.add(format, v...) }
func (l *serverLog) Warnf(format string, v ...any)   { l.add(format, v...) }
func (l *serverLog) Fatalf(format string, v ...any)  { l.add(format, v...) }
func (l *serverLog) Errorf(format string, v ...any)  { l.add(format, v...) }
func (l *serverLog) Debugf(format string, v ...any)  { l.add(format, v...) }
func (l *serverLog) Tracef(format string, v ...any)  { l.add(format, v...) }

// find returns the first line that holds every one of parts, or "".
func (l *serverLog) find(parts ...string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return line
		}
	}
	return ""
}

// A server of deploy/ that leads the bucket's stream and is stopped as
// the deployments stop it hands the leadership to a peer before it goes,
// and grants go on throughout. Lame duck mode (SIGUSR2: systemd's
// KillSignal, compose's stop_signal, the NATS chart's pre-stop hook; a
// SIGTERM that follows it is ignored) and a plain SIGTERM both step the
// server's raft groups down with a leadership transfer to a current
// peer, which takes over at once instead of after a raft election
// timeout (4 to 9 s). The proof is the stopping server's own log: it
// names the peer it hands the bucket's stream to, and that peer is the
// next leader. A stop without the hand-over (a kill, or a server that no
// longer transfers) fails here.
func TestStoppedLeaderHandsTheBucketOver(t *testing.T) {
	for _, stop := range []struct {
		name string
		stop func(*server.Server)
	}{
		{"lame duck", (*server.Server).LameDuckShutdown},
		{"SIGTERM", (*server.Server).Shutdown},
	} {
		t.Run(stop.name, func(t *testing.T) {
			c := startClusterLogged(t)
			c.serve()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			old := -1
			testenv.Eventually(t, 30*time.Second, func() bool {
				old = c.streamLeader()
				return old >= 0
			}, "the bucket's stream has a leader")
			oldSrv := c.servers[old]
			group := c.raftGroup(t, old)

			// A caller on another server acquires and releases one
			// resource after another until after the stop.
			cl := newClient(t, c.connect("orders", c.servers[(old+1)%len(c.servers)].ClientURL()))
			stopped := make(chan struct{})
			type grant struct {
				token uint64
				err   error
				after bool // sent after the old leader had shut down
			}
			grants := make(chan []grant, 1)
			go func() {
				var out []grant
				after := 0
				for i := 0; after < 5 && ctx.Err() == nil; i++ {
					g := grant{}
					select {
					case <-stopped:
						g.after = true
						after++
					default:
					}
					l, err := cl.TryAcquire(ctx, fmt.Sprintf("maintenance/%d", i), client.Owner("orders"))
					g.err = err
					if err == nil {
						g.token = l.Token()
						g.err = l.Release(ctx)
					}
					out = append(out, g)
				}
				grants <- out
			}()
			// Some grants before the stop.
			time.Sleep(500 * time.Millisecond)
			go func() {
				stop.stop(oldSrv)
				oldSrv.WaitForShutdown()
				close(stopped)
			}()
			next := -1
			testenv.Eventually(t, time.Minute, func() bool {
				next = c.streamLeader(old)
				return next >= 0
			}, "another server leads the bucket's stream")
			select {
			case <-stopped:
			case <-ctx.Done():
				t.Fatalf("%s did not shut down", oldSrv.Name())
			}
			log := c.logs[oldSrv.Name()]
			if line := log.find(group, fmt.Sprintf("Selected %q for new leader", c.servers[next].Node()), "leadership transfer"); line == "" {
				t.Fatalf("%s, leader of the bucket's stream (raft group %s), stopped (%s) without handing it to %s, the next leader; its log says of the group:\n%s",
					oldSrv.Name(), group, stop.name, c.servers[next].Name(), strings.Join(c.logLines(oldSrv.Name(), group), "\n"))
			}

			var all []grant
			select {
			case all = <-grants:
			case <-ctx.Done():
				t.Fatal("the grants did not end")
			}
			var last uint64
			before, after := 0, 0
			for i, g := range all {
				if g.err != nil {
					t.Errorf("grant %d (after the stop: %t): %v", i, g.after, g.err)
					continue
				}
				if g.token <= last {
					t.Errorf("grant %d: token %d after %d", i, g.token, last)
				}
				last = g.token
				if g.after {
					after++
				} else {
					before++
				}
			}
			if before == 0 || after < 5 {
				t.Fatalf("%d grants before the old leader shut down and %d after, want some and 5", before, after)
			}
		})
	}
}

// streamLeader returns the index of the running server that leads the
// bucket's stream, none of not, or -1.
func (c *cluster) streamLeader(not ...int) int {
	for i, s := range c.servers {
		skip := !s.Running()
		for _, n := range not {
			skip = skip || n == i
		}
		if !skip && s.JetStreamIsStreamLeader(bucketAccount, bucketStream) {
			return i
		}
	}
	return -1
}

// raftGroup returns the name of the bucket stream's raft group, as server
// i knows it.
func (c *cluster) raftGroup(t *testing.T, i int) string {
	t.Helper()
	jsz, err := c.servers[i].Jsz(&server.JSzOptions{Accounts: true, Streams: true, RaftGroups: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range jsz.AccountDetails {
		for _, st := range a.Streams {
			if a.Name == bucketAccount && st.Name == bucketStream && st.RaftGroup != "" {
				return st.RaftGroup
			}
		}
	}
	t.Fatal(errors.New("the bucket's stream has no raft group"))
	return ""
}

// logLines returns the lines of server name's log that mention group.
func (c *cluster) logLines(name, group string) []string {
	l := c.logs[name]
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, group) {
			out = append(out, line)
		}
	}
	return out
}
