package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/service"
)

// readyz returns /readyz's status code and decoded Health.
func readyz(t *testing.T, base string) (int, service.Health) {
	t.Helper()
	code, body := get(t, base+"/readyz")
	var h service.Health
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatalf("/readyz body %q: %v", body, err)
	}
	if (code == http.StatusOK) != h.Ready {
		t.Fatalf("/readyz = %d with ready %v", code, h.Ready)
	}
	return code, h
}

// /readyz turns unready (503, with the problems) when two of the three
// nodes stop and the bucket has no quorum, while /healthz stays 200; it is
// ready again once they are back.
func TestReadyzFollowsQuorum(t *testing.T) {
	env := testenv.Start(t)
	// Before Run serves, an instance is not ready (and asking is safe).
	idle, err := service.New(env.ConnectAs(devcluster.Service), env.ConnectAs(devcluster.Store), testenv.Config())
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	newHTTPHandler(prometheus.NewRegistry(), idle, false).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "not serving yet") {
		t.Fatalf("/readyz of an instance not run = %d %s, want 503, not serving yet", rec.Code, rec.Body)
	}

	l := startLockd(t, append(serviceArgs(env), "--metrics", "127.0.0.1:0")...)
	waitFor(t, 60*time.Second, func() string {
		if code, h := readyz(t, l.metrics); code != http.StatusOK {
			return strings.Join(h.Problems, "; ")
		}
		return ""
	})
	start := time.Now()
	env.Cluster.Stop(1)
	env.Cluster.Stop(2)
	var problems []string
	waitFor(t, 60*time.Second, func() string {
		code, h := readyz(t, l.metrics)
		if code != http.StatusServiceUnavailable || len(h.Problems) == 0 {
			return "still ready"
		}
		problems = h.Problems
		return ""
	})
	t.Logf("unready %v after two nodes stopped: %v", time.Since(start).Round(time.Millisecond), problems)
	if code, _ := get(t, l.metrics+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d without a quorum, want 200 (the process is alive)", code)
	}
	start = time.Now()
	for _, i := range []int{1, 2} {
		if err := env.Cluster.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 60*time.Second, func() string {
		if code, h := readyz(t, l.metrics); code != http.StatusOK {
			return strings.Join(h.Problems, "; ")
		}
		return ""
	})
	t.Logf("ready %v after the restarts began", time.Since(start).Round(time.Millisecond))
}

// /readyz does not trust a stream check that is too old.
func TestReadinessStale(t *testing.T) {
	now := time.Now()
	fresh := service.Health{Ready: true, Checked: now.Add(-time.Second)}
	if h := readiness(fresh, now); !h.Ready {
		t.Fatalf("fresh check: %+v, want ready", h)
	}
	stale := service.Health{Ready: true, Checked: now.Add(-healthStale - time.Second)}
	if h := readiness(stale, now); h.Ready || len(h.Problems) != 1 {
		t.Fatalf("stale check: %+v, want not ready with one problem", h)
	}
}

// The runtime's profiles are served only when asked for.
func TestPProfOnlyWhenAskedFor(t *testing.T) {
	for _, on := range []bool{false, true} {
		rec := httptest.NewRecorder()
		newHTTPHandler(prometheus.NewRegistry(), nil, on).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/", nil))
		if got := rec.Code == http.StatusOK && strings.Contains(rec.Body.String(), "goroutine"); got != on {
			t.Errorf("pprof %v: GET /debug/pprof/ = %d, want the index only when on", on, rec.Code)
		}
	}
}

// Bad values for lockd's flags, checked through service.Config.Validate
// and kong, are one line on stderr and exit 2, and nothing starts: no dev
// cluster directory appears.
func TestServeBadValues(t *testing.T) {
	for _, args := range [][]string{
		{"--max-hold=-1s"},
		{"--max-hold", "500ms"}, // below the min TTL
		{"--max-hold", "9000h"}, // above the ceiling
		{"--owner-rate=-1"},
		{"--user-rate=-0.5"},
		{"--max-per-key", "0"},
		{"--min-ttl", "500ms"},
		{"--max-in-flight", "0"},
		{"--replicas", "1"}, // without --allow-single-replica
		{"--prefix", "bad prefix"},
		{"--dev-ports", "1,2"},
		{"--log-level", "loud"},
		{"--max-hold", "forever"},
		{"--pprof"}, // without --metrics
		{"--bogus"},
	} {
		dir := filepath.Join(t.TempDir(), "dev")
		all := append([]string{"--dev", "--dev-dir", dir}, args...)
		code, out, errOut := runBin(t, all...)
		if code != exitUsage || out != "" || !strings.HasPrefix(errOut, "lockd: ") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("lockd %v = %d, stdout %q, stderr %q; want 2, nothing, one line", args, code, out, errOut)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("lockd %v started the dev cluster (%s exists)", args, dir)
		}
	}
	// A good --max-hold of 0 (no cap) and the rates pass validation: the
	// error is then the unreachable server.
	closed := freePorts(t, 1)[0]
	code, _, errOut := runBin(t, "--url", "nats://127.0.0.1:"+itoa(closed), "--max-hold", "0", "--owner-rate", "5", "--user-rate", "50", "--max-per-key", "8")
	if code != exitFailed || !strings.Contains(errOut, "connect") {
		t.Fatalf("lockd with good values and no server = %d, %q; want 1, a connect error", code, errOut)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
