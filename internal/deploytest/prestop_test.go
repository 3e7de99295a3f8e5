package deploytest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"gopkg.in/yaml.v3"
)

// preStop is a deployment's pre-stop step for a NATS server: the command
// line of its lockd handover, after the binary, and the paths of the
// server's host (or pod) it names.
type preStop struct {
	args []string
	// ca, cert, key and seed are the paths of the CA, the server's
	// certificate and key, and the inspector's seed.
	ca, cert, key, seed string
}

// The pre-stop step of nats-server.service (ExecStop) and of the NATS
// chart's values (the nats container's pre-stop hook), each run as its
// file gives it, with its paths mapped onto this cluster's files, against
// the server that leads the bucket's stream: the stream goes to another
// server before any signal, and the lame duck mode that follows finds
// nothing of the bucket's to hand over (the server's log selects no
// leader for the bucket's raft group). On a server that does not lead the
// stream the step does nothing. Without the step in a file, or with an
// inspector that may not step the stream down, this fails.
func TestThePreStopStepHandsTheBucketOverBeforeTheStop(t *testing.T) {
	bin := buildLockd(t)
	for name, step := range map[string]preStop{"systemd": systemdPreStop(t), "kubernetes": chartPreStop(t)} {
		t.Run(name, func(t *testing.T) {
			c, old, group := startLed(t)
			oldSrv := c.servers[old]
			other := c.servers[(old+1)%len(c.servers)]

			if out, err := c.runPreStop(t, bin, step, other); err != nil || !strings.Contains(out, "nothing to hand over") {
				t.Fatalf("pre-stop on %s, which does not lead: %v, %q", other.Name(), err, out)
			}
			if c.streamLeader() != old {
				t.Fatalf("the stream's leader moved off %s after a pre-stop step on another server", oldSrv.Name())
			}

			out, err := c.runPreStop(t, bin, step, oldSrv)
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
		})
	}
}

// systemdPreStop is nats-server.service's ExecStop.
func systemdPreStop(t *testing.T) preStop {
	stop := systemdUnit(t, "nats-server.service")["ExecStop"]
	if len(stop) != 1 || !strings.HasPrefix(stop[0], "-") {
		t.Fatalf("nats-server.service ExecStop %q: want one pre-stop step whose failure does not hold the stop", stop)
	}
	return preStop{args: handoverArgs(t, "nats-server.service", strings.TrimPrefix(stop[0], "-"), "/usr/local/bin/lockd"),
		ca: tlsDir + "ca.pem", cert: tlsDir + "server.pem", key: tlsDir + "server-key.pem", seed: "/etc/nats/inspector.nk"}
}

// chartPreStop is the pre-stop hook that nats-values.yaml gives the nats
// container: lockd handover, then the chart's own hook (lame duck mode,
// nats-io/k8s nats-2.14.2 files/stateful-set/nats-container.yaml), with
// lockd copied in by an init container from lockd's image and the
// inspector's seed from its secret.
func chartPreStop(t *testing.T) preStop {
	var v map[string]any
	if err := yaml.Unmarshal([]byte(readDeploy(t, "k8s/nats-values.yaml")), &v); err != nil {
		t.Fatal(err)
	}
	var hook []any
	mounts := map[string]string{}
	for _, p := range dig(v, "container", "patch").([]any) {
		switch dig(p, "path") {
		case "/lifecycle/preStop/exec/command":
			hook, _ = dig(p, "value").([]any)
		case "/volumeMounts/-":
			mounts[fmt.Sprint(dig(p, "value", "name"))] = fmt.Sprint(dig(p, "value", "mountPath"))
		}
	}
	if len(hook) != 3 || hook[0] != "sh" || hook[1] != "-c" {
		t.Fatalf("nats-values.yaml: the nats container's pre-stop hook %v: want sh -c with lockd handover, then lame duck mode", hook)
	}
	steps := strings.Split(hook[2].(string), ";")
	if len(steps) != 2 || strings.Join(strings.Fields(steps[1]), " ") != "exec nats-server -sl=ldm=/var/run/nats/nats.pid" {
		t.Fatalf("nats-values.yaml pre-stop hook %q: want lockd handover; then the chart's own lame duck step", hook[2])
	}
	volumes := map[string]any{}
	var inits []any
	for _, p := range dig(v, "podTemplate", "patch").([]any) {
		switch dig(p, "path") {
		case "/spec/volumes/-":
			volumes[fmt.Sprint(dig(p, "value", "name"))] = dig(p, "value")
		case "/spec/initContainers":
			inits, _ = dig(p, "value").([]any)
		}
	}
	copied := slices.ContainsFunc(inits, func(c any) bool {
		cmd := fmt.Sprint(dig(c, "command"))
		return dig(c, "image") == "jetlock/lockd:latest" && cmd == "[cp /usr/local/bin/lockd "+mounts["jetlock-bin"]+"/lockd]"
	})
	if !copied || volumes["jetlock-bin"] == nil || dig(volumes["jetlock-inspector"], "secret", "secretName") != "jetlock-inspector" {
		t.Fatalf("nats-values.yaml: lockd's binary (init containers %v) or the inspector's secret (volumes %v) is not where the hook runs them", inits, volumes)
	}
	return preStop{args: handoverArgs(t, "nats-values.yaml", steps[0], mounts["jetlock-bin"]+"/lockd"),
		ca: "/etc/nats-ca-cert/" + dig(v, "tlsCA", "key").(string), cert: "/etc/nats-certs/nats/tls.crt", key: "/etc/nats-certs/nats/tls.key",
		seed: mounts["jetlock-inspector"] + "/inspector.nk"}
}

// handoverArgs checks that cmd runs bin handover and returns its
// arguments after bin.
func handoverArgs(t *testing.T, file, cmd, bin string) []string {
	args := strings.Fields(cmd)
	if len(args) < 2 || args[0] != bin || args[1] != "handover" {
		t.Fatalf("%s: the pre-stop step %q: want %s handover", file, cmd, bin)
	}
	return args[1:]
}

// runPreStop runs step on srv's host: its command line with its paths
// (the TLS files, the inspector's seed, the server's ports) mapped onto
// this cluster's, with lockd built here.
func (c *cluster) runPreStop(t *testing.T, bin string, step preStop, srv *server.Server) (string, error) {
	t.Helper()
	seed, err := c.keys["inspector"].Seed()
	if err != nil {
		t.Fatal(err)
	}
	nk := filepath.Join(t.TempDir(), "inspector.nk")
	if err := os.WriteFile(nk, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(c.ca.CertFile) + "/"
	mapped := strings.NewReplacer(
		step.ca, c.ca.CertFile, step.cert, dir+"server.pem", step.key, dir+"server-key.pem", step.seed, nk,
		fmt.Sprintf("http://127.0.0.1:%d", monitorPort), "http://"+srv.MonitorAddr().String(),
		fmt.Sprintf("tls://127.0.0.1:%d", clientPort), "tls://"+srv.Addr().String(),
	)
	args := slices.Clone(step.args)
	for i := range args {
		args[i] = mapped.Replace(args[i])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	return string(out), err
}
