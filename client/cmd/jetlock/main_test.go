package main_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/client/fence"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

// The tests run the built jetlock binary against one real three-node
// cluster and one service instance, shared by the whole package to keep
// it fast. Each test uses resources of its own.

var (
	bin     string // the jetlock binary
	cluster *devcluster.Cluster
	urls    string
)

// helperEnv makes the test binary act as a child command (see helper).
const helperEnv = "JETLOCK_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helper(mode, os.Args[1:]))
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "jetlock-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin = filepath.Join(dir, "jetlock")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build jetlock:", err)
		return 1
	}
	cluster, err = devcluster.Start(devcluster.Options{Dir: filepath.Join(dir, "nats")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cluster.Shutdown()
	urls = cluster.URLs()
	stop, err := serve()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	return m.Run()
}

// serve runs a service instance with test timings (expiry grace 0.5s)
// until stop, once it answers through every node.
func serve() (stop func(), err error) {
	nc, store, err := cluster.ConnectService()
	if err != nil {
		return nil, err
	}
	cfg := service.DefaultConfig()
	cfg.ExpiryGrace = 500 * time.Millisecond
	cfg.SweepInterval = 50 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := service.New(nc, store, cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	stop = func() { cancel(); <-done; nc.Close(); store.Close() }
	select {
	case <-svc.Ready():
	case err := <-done:
		return nil, err
	case <-time.After(60 * time.Second):
		stop()
		return nil, fmt.Errorf("service not ready in 60s")
	}
	for i := range devcluster.Size {
		c, err := nats.Connect(cluster.ClientURL(i))
		if err != nil {
			stop()
			return nil, err
		}
		ok := false
		for range 500 {
			if _, err := c.Request(streams.Subject(streams.DefaultPrefix, streams.OpStatus), []byte(`{"resource":"ping"}`), time.Second); err == nil {
				ok = true
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		c.Close()
		if !ok {
			stop()
			return nil, fmt.Errorf("service unreachable through node %d", i)
		}
	}
	return stop, nil
}

// result is a finished jetlock process.
type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// proc is a running jetlock process.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	start          time.Time
	done           chan struct{}
	res            result
}

// syncBuffer is what a process writes while the test reads it.
type syncBuffer = testenv.SyncBuffer

// start runs jetlock with args as a caller (no credentials) and env
// added to the environment.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--server", urls}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	p := &proc{cmd: cmd, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	p.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		p.res = result{code: cmd.ProcessState.ExitCode(), stdout: p.stdout.String(), stderr: p.stderr.String(), took: time.Since(p.start)}
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits up to d for p to exit.
func (p *proc) wait(t *testing.T, d time.Duration) result {
	t.Helper()
	select {
	case <-p.done:
		return p.res
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("jetlock %v did not exit in %v; stderr: %s", p.cmd.Args[1:], d, p.res.stderr)
		return p.res
	}
}

// jl runs jetlock to completion (at most 60s).
func jl(t *testing.T, args ...string) result {
	t.Helper()
	return start(t, nil, args...).wait(t, 60*time.Second)
}

// operator prefixes args with the dev cluster's operator credentials.
func operator(args ...string) []string {
	user, pw := cluster.User(devcluster.Operator)
	return append([]string{"--user", user, "--password", pw}, args...)
}

// inspector prefixes args with the dev cluster's inspector credentials
// (read-only access to the bucket, for watch).
func inspector(args ...string) []string {
	user, pw := cluster.User(devcluster.Inspector)
	return append([]string{"--user", user, "--password", pw}, args...)
}

// wantCode fails unless r exited with code and, for a failure, printed
// exactly one line on stderr starting with "jetlock: ".
func wantCode(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d; stdout %q stderr %q", r.code, code, r.stdout, r.stderr)
	}
	if code != 0 {
		if lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "jetlock: ") {
			t.Fatalf("stderr is not one jetlock line: %q", r.stderr)
		}
	}
}

// wantError is wantCode for a failure whose line is also in one voice
// (see wantOneVoice).
func wantError(t *testing.T, r result, code int) {
	t.Helper()
	wantCode(t, r, code)
	wantOneVoice(t, r.stderr)
}

// errorCodes are the CODEs of "jetlock: CODE: message".
var errorCodes = []string{"usage", "invalid_request", "locked", "lease_lost", "too_many_waiters", "unavailable",
	"internal", "permission_denied", "interrupted", "command_not_found", "cannot_execute", "failure"}

// wireUnits finds the wire contract's millisecond fields, and durations
// written with zero units (Go's 24h0m0s, 10m0s), in a message.
var wireUnits = regexp.MustCompile(`\b[a-z_]+_ms\b|\d[hm]0[ms]`)

// wantOneVoice fails unless line, an error jetlock printed, is
// "jetlock: CODE: message" with a known CODE, a message that does not say
// CODE again ("unavailable: service unavailable: ..."), and durations
// written as the flags take them (1s, 10m, 24h), never in milliseconds.
func wantOneVoice(t *testing.T, line string) {
	t.Helper()
	line = strings.TrimSpace(line)
	code, msg, ok := strings.Cut(strings.TrimPrefix(line, "jetlock: "), ": ")
	if !ok || !strings.HasPrefix(line, "jetlock: ") || !slices.Contains(errorCodes, code) {
		t.Fatalf("%q is not \"jetlock: CODE: message\" with a known CODE", line)
	}
	if words := strings.ReplaceAll(code, "_", " "); strings.Contains(msg, words) || strings.Contains(msg, code) {
		t.Fatalf("%q says %q twice", line, code)
	}
	if m := wireUnits.FindString(msg); m != "" {
		t.Fatalf("%q has %q: durations are written like 1s, 10m, 24h", line, m)
	}
}

// wantPassthrough fails unless r exited with the command's code and
// jetlock printed nothing.
func wantPassthrough(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code || r.stderr != "" {
		t.Fatalf("exit code %d, stderr %q; want the command's %d and nothing printed", r.code, r.stderr, code)
	}
}

// waitFile waits up to d for path to exist.
func waitFile(t *testing.T, path string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not created in %v", path, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// newClient returns a Go client on a caller's connection, for checks.
func newClient(t *testing.T) *client.Client {
	t.Helper()
	nc, err := nats.Connect(urls)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func status(t *testing.T, c *client.Client, resource string) *client.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx, resource)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// fencedStore is a store shared by processes over loopback HTTP: each
// write carries a resource and a token, checked by fence.Memory in the
// same step as the write.
type fencedStore struct {
	guard *fence.Memory
	mu    sync.Mutex
	data  map[string]string
	srv   *httptest.Server
}

func newFencedStore(t *testing.T) *fencedStore {
	s := &fencedStore{guard: fence.NewMemory(), data: map[string]string{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		token, err := strconv.ParseUint(q.Get("token"), 10, 64)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		err = s.guard.Do(r.Context(), q.Get("resource"), token, func() error {
			s.mu.Lock()
			s.data[q.Get("resource")] = q.Get("value")
			s.mu.Unlock()
			return nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		fmt.Fprintln(w, "accepted")
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *fencedStore) get(resource string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data[resource]
}

// helperCmd is the command line that runs this test binary as helper mode.
func helperCmd(mode string, args ...string) (env []string, argv []string) {
	return []string{helperEnv + "=" + mode}, append([]string{os.Args[0]}, args...)
}

// helper is the test binary run as a child of jetlock run:
//
//	fencedwrite URL VALUE GOFILE RESULTFILE: waits for GOFILE, writes
//	VALUE with $JETLOCK_TOKEN to the fenced store at URL, writes the
//	store's answer to RESULTFILE, then sleeps (up to 30s) until killed.
//	countterm FILE: writes its pid to FILE, then appends a line "TERM" to
//	FILE.term for every SIGTERM it gets, which it otherwise ignores, for
//	up to 60s (signal_unix_test.go).
func helper(mode string, args []string) int {
	switch mode {
	case "fencedwrite":
		url, value, goFile, resultFile := args[0], args[1], args[2], args[3]
		for i := 0; i < 3000 && !exists(goFile); i++ {
			time.Sleep(10 * time.Millisecond)
		}
		resp, err := http.Get(url + "?resource=" + os.Getenv("JETLOCK_RESOURCE") + "&token=" + os.Getenv("JETLOCK_TOKEN") + "&value=" + value)
		answer := ""
		if err != nil {
			answer = "error " + err.Error()
		} else {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answer = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		}
		if err := os.WriteFile(resultFile+".tmp", []byte(answer), 0o644); err != nil {
			return 1
		}
		if err := os.Rename(resultFile+".tmp", resultFile); err != nil {
			return 1
		}
		time.Sleep(30 * time.Second)
		return 0
	case "countterm":
		return countTerm(args[0])
	}
	fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
	return 1
}

// countTerm is the countterm helper (see helper): it counts the SIGTERMs
// it gets, each a line in FILE.term, and ignores them.
func countTerm(file string) int {
	terms := make(chan os.Signal, 64)
	signal.Notify(terms, syscall.SIGTERM)
	out, err := os.OpenFile(file+".term", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 1
	}
	defer out.Close()
	if err := os.WriteFile(file, []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		return 1
	}
	end := time.After(60 * time.Second)
	for {
		select {
		case <-terms:
			fmt.Fprintln(out, "TERM")
		case <-end:
			return 0
		}
	}
}
