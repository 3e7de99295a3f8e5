package deploytest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetlock/jetlock/internal/testenv"
)

// nats-server.service's stop first runs its pre-stop step (ExecStop:
// lockd handover, as the inspector, on the server's own host). Run here
// as the unit gives it, with its paths mapped onto this cluster's files,
// against the server that leads the bucket's stream: the stream goes to
// another server before any signal, and the lame duck mode that follows
// finds nothing of the bucket's to hand over (the server's log selects no
// leader for the bucket's raft group). Without the step in the unit, or
// with an inspector that may not step the stream down, this fails.
func TestThePreStopStepHandsTheBucketOverBeforeTheStop(t *testing.T) {
	c := startClusterLogged(t)
	c.serve()
	bin := buildLockd(t)
	old := -1
	testenv.Eventually(t, 30*time.Second, func() bool {
		old = c.streamLeader()
		return old >= 0
	}, "the bucket's stream has a leader")
	oldSrv := c.servers[old]
	group := c.raftGroup(t, old)
	other := c.servers[(old+1)%len(c.servers)]

	// On a server that does not lead the stream the step does nothing.
	if out, err := c.runPreStop(t, bin, other); err != nil || !strings.Contains(out, "nothing to hand over") {
		t.Fatalf("pre-stop on %s, which does not lead: %v, %q", other.Name(), err, out)
	}
	if c.streamLeader() != old {
		t.Fatalf("the stream's leader moved off %s after a pre-stop step on another server", oldSrv.Name())
	}

	out, err := c.runPreStop(t, bin, oldSrv)
	if err != nil {
		t.Fatalf("pre-stop on %s, the leader: %v\n%s", oldSrv.Name(), err, out)
	}
	next := c.streamLeader(old)
	if next < 0 || !strings.Contains(out, fmt.Sprintf("%s handed %s over to %s", oldSrv.Name(), bucketStream, c.servers[next].Name())) {
		t.Fatalf("after the pre-stop step on %s the stream is led by server %d; the step said %q", oldSrv.Name(), next, out)
	}
	if c.streamLeader() != next {
		t.Fatalf("%s still leads the stream", oldSrv.Name())
	}

	log := c.logs[oldSrv.Name()]
	from := log.len()
	oldSrv.LameDuckShutdown()
	oldSrv.WaitForShutdown()
	if line := log.findFrom(from, group, "for new leader"); line != "" {
		t.Fatalf("%s handed the bucket's stream over again in lame duck mode: %s", oldSrv.Name(), line)
	}
	if c.streamLeader(old) != next {
		t.Fatalf("the stream's leader changed during %s's lame duck mode", oldSrv.Name())
	}
}

// runPreStop runs nats-server.service's ExecStop on srv's host: the
// unit's command line, its binary built here and its paths (the TLS
// files, the inspector's seed, the server's ports) mapped onto this
// cluster's.
func (c *cluster) runPreStop(t *testing.T, bin string, srv *server.Server) (string, error) {
	t.Helper()
	stop := systemdUnit(t, "nats-server.service")["ExecStop"]
	if len(stop) != 1 || !strings.HasPrefix(stop[0], "-") {
		t.Fatalf("nats-server.service ExecStop %q: want one pre-stop step whose failure does not hold the stop", stop)
	}
	args := strings.Fields(strings.TrimPrefix(stop[0], "-"))
	if args[0] != "/usr/local/bin/lockd" || len(args) < 2 || args[1] != "handover" {
		t.Fatalf("nats-server.service ExecStop %q: want lockd handover", stop[0])
	}
	seed, err := c.keys["inspector"].Seed()
	if err != nil {
		t.Fatal(err)
	}
	nk := filepath.Join(t.TempDir(), "inspector.nk")
	if err := os.WriteFile(nk, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	mapped := strings.NewReplacer(
		tlsDir, filepath.Dir(c.ca.CertFile)+"/",
		"/etc/nats/inspector.nk", nk,
		fmt.Sprintf("http://127.0.0.1:%d", monitorPort), "http://"+srv.MonitorAddr().String(),
		fmt.Sprintf("tls://127.0.0.1:%d", clientPort), "tls://"+srv.Addr().String(),
	)
	for i := range args {
		args[i] = mapped.Replace(args[i])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args[1:]...)
	cmd.Env = []string{"HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	return string(out), err
}
