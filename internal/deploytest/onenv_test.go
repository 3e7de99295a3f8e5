package deploytest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// One environment file serves the servers and lockd: the jetlock.env that
// make-nkeys.sh writes (the users' public keys, JETLOCK_<ROLE>_NKEY_PUBLIC)
// plus lockd's connection (JETLOCK_SERVER, JETLOCK_TLS*, and
// JETLOCK_NKEY, JETLOCK_STORE_NKEY: the paths of its seed files). The
// three servers start from deploy/nats with it, parse it again whole, and
// the lockd binary serves with that file as its only configuration
// (no flags, no other environment): a caller is answered.
func TestOneEnvironmentFile(t *testing.T) {
	bin := buildLockd(t)
	out := t.TempDir()
	ks := makeNkeys(t, buildNK(t), out)
	envPath := filepath.Join(out, "jetlock.env")
	for k, v := range envFile(t, string(mustRead(t, envPath))) {
		t.Setenv(k, v)
	}
	c := startClusterWith(t, ks)

	// lockd's part, appended as systemd/jetlock.env.example has it.
	cert := c.certs["lockd"]
	lockdPart := fmt.Sprintf("JETLOCK_SERVER=%s\nJETLOCK_TLSCA=%s\nJETLOCK_TLSCERT=%s\nJETLOCK_TLSKEY=%s\nJETLOCK_NKEY=%s\nJETLOCK_STORE_NKEY=%s\n",
		c.urls(), c.ca.CertFile, cert.CertFile, cert.KeyFile,
		filepath.Join(out, "secrets", "service.nk"), filepath.Join(out, "secrets", "store.nk"))
	f, err := os.OpenFile(envPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(lockdPart); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	whole := envFile(t, string(mustRead(t, envPath)))

	// The servers' configuration with the whole file in the environment.
	for k, v := range whole {
		t.Setenv(k, v)
	}
	d := filepath.Join(t.TempDir(), "whole")
	render(t, d, [][2]string{{tlsDir, filepath.Dir(c.ca.CertFile) + "/"}, {storeDir, filepath.Join(d, "data")}})
	o := parse(t, filepath.Join(d, "nats-a.conf"))
	checkAccounts(t, o, ks)

	// lockd with that file only.
	var env []string
	for k, v := range whole {
		env = append(env, k+"="+v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = env
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		once := sync.Once{}
		for sc.Scan() {
			if strings.Contains(sc.Text(), "jetlock is serving") {
				once.Do(func() { close(serving) })
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-serving:
	case err := <-exited:
		t.Fatalf("lockd with the environment file exited before serving: %v\n%s", err, stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("lockd not serving in 60s:\n%s", stderr.String())
	}
	orders := c.connect("orders", "")
	msg, err := orders.Request(streams.Subject(streams.DefaultPrefix, streams.OpStatus), []byte(`{"resource":"one/env"}`), 10*time.Second)
	if err != nil || !strings.Contains(string(msg.Data), `"held":false`) {
		t.Fatalf("status through lockd: %v %v", msg, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("lockd stopped with %v:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("lockd did not stop in 30s")
	}
}

// lockedBuffer is a strings.Builder safe for a writer and a reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
