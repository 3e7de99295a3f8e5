package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// lockdBin is the lockd binary, built once by TestMain, for the tests
// that check exit codes of the real process.
var lockdBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lockdBin = filepath.Join(dir, "lockd")
	build := exec.Command("go", "build", "-o", lockdBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build lockd:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// syncBuffer is what a process writes while the test reads it.
type syncBuffer = testenv.SyncBuffer

// lockd is a lockd serving in this process through run, as main runs it.
type lockd struct {
	stdout, stderr *syncBuffer
	metrics        string // base URL of --metrics, when given
	stop           context.CancelFunc
	code           chan int
	once           sync.Once
	exit           int
}

var metricsLine = regexp.MustCompile(`Metrics: (http://\S+)/metrics`)

// startLockd runs lockd with args in this process and waits until it
// serves. It is stopped at cleanup.
func startLockd(t *testing.T, args ...string) *lockd {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &lockd{stdout: &syncBuffer{}, stderr: &syncBuffer{}, stop: cancel, code: make(chan int, 1)}
	go func() { l.code <- run(ctx, args, l.stdout, l.stderr) }()
	deadline := time.After(60 * time.Second)
	for !strings.Contains(l.stdout.String(), "jetlock is serving") {
		select {
		case code := <-l.code:
			t.Fatalf("lockd exited with %d before serving: %s", code, l.stderr.String())
		case <-deadline:
			cancel()
			t.Fatalf("lockd not serving in 60s: %s", l.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if m := metricsLine.FindStringSubmatch(l.stdout.String()); m != nil {
		l.metrics = m[1]
	}
	t.Cleanup(func() { l.shutdown(t) })
	return l
}

// shutdown stops lockd and returns its exit code (-1 if it did not stop
// in 30s); later calls return the same.
func (l *lockd) shutdown(t *testing.T) int {
	t.Helper()
	l.once.Do(func() {
		l.stop()
		select {
		case l.exit = <-l.code:
		case <-time.After(30 * time.Second):
			l.exit = -1
			t.Errorf("lockd did not stop in 30s")
		}
	})
	return l.exit
}

// serviceArgs are the connection flags of the service's two users on env.
func serviceArgs(env *testenv.Env) []string {
	su, sp := env.Cluster.User(devcluster.Service)
	tu, tp := env.Cluster.User(devcluster.Store)
	return []string{"--server", env.Cluster.URLs(), "--user", su, "--password", sp, "--store-user", tu, "--store-password", tp}
}

// storeArgs are the connection flags of lockd check as the store user.
func storeArgs(env *testenv.Env) []string {
	tu, tp := env.Cluster.User(devcluster.Store)
	return []string{"--server", env.Cluster.URLs(), "--store-user", tu, "--store-password", tp}
}

// runBin runs the lockd binary with args and returns its exit code and
// output. It must end within 60s.
func runBin(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, lockdBin, args...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("lockd %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("lockd %v did not end in 60s", args)
	}
	return code, out.String(), errOut.String()
}

// get fetches url and returns the status code and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// scrape fetches and parses /metrics.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// sample returns the metric of family name whose labels include want, or
// nil.
func sample(mfs map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	mf := mfs[name]
	if mf == nil {
		return nil
	}
	for _, m := range mf.GetMetric() {
		if testenv.HasLabels(m, want) {
			return m
		}
	}
	return nil
}

// counter returns the value of a counter or gauge sample, 0 when absent.
func counter(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	m := sample(mfs, name, labels)
	switch {
	case m == nil:
		return 0
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}

// histCount returns the sample count of a histogram, 0 when absent.
func histCount(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) uint64 {
	if m := sample(mfs, name, labels); m != nil && m.Histogram != nil {
		return m.GetHistogram().GetSampleCount()
	}
	return 0
}

// call sends a request of the wire contract on nc and decodes the reply
// into resp; it returns the error code of an error reply ("" on success).
func call(t *testing.T, nc *nats.Conn, op string, req any, resp any) string {
	t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := nc.Request(streams.Subject(streams.DefaultPrefix, op), b, 15*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	var e streams.ErrorResponse
	if json.Unmarshal(msg.Data, &e) == nil && e.Error.Code != "" {
		return e.Error.Code
	}
	if resp != nil {
		if err := json.Unmarshal(msg.Data, resp); err != nil {
			t.Fatalf("%s reply %s: %v", op, msg.Data, err)
		}
	}
	return ""
}

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

// waitFor polls cond every 50ms until it returns "" (satisfied), and fails
// with its last answer once timeout has passed.
func waitFor(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not so after %v: %s", timeout, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
