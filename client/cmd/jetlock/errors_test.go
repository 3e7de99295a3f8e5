package main_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// A bound is worded the same whoever enforces it: the command's own check
// and the service's both in the flags' units, each error's code said
// once.
func TestErrorsInOneVoice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		// The service's bound (10m by default), in wire units on the wire.
		{[]string{"acquire", "--ttl", "1h", "voice:1"}, 2, "jetlock: invalid_request: --ttl 1h outside [1s, 10m] (the service's bounds)\n"},
		{[]string{"renew", "--lease-id", "0a", "--ttl", "90m", "voice:1"}, 2, "jetlock: invalid_request: --ttl 1h30m outside [1s, 10m] (the service's bounds)\n"},
		// The command's own bound.
		{[]string{"acquire", "--ttl", "25h", "voice:1"}, 2, "jetlock: usage: --ttl 25h outside [1s, 24h] (see jetlock acquire --help)\n"},
		{[]string{"--timeout", "20m", "status", "voice:1"}, 2, "jetlock: usage: --timeout 20m outside [100ms, 10m]\n"},
		{[]string{"renew", "--lease-id", "0a", "voice:1"}, 79, "jetlock: lease_lost: lease is no longer current\n"},
		{[]string{"revoke", "voice:1", "--reason", "x"}, 77, `jetlock: permission_denied: publish to "jetlock.v1.admin.revoke" refused by the NATS server (this needs other credentials: --creds, --user/--password, --nkey or --context; revoke needs an operator's, watch an inspector's)` + "\n"},
	} {
		r := jl(t, tc.args...)
		wantError(t, r, tc.code)
		if r.stderr != tc.want {
			t.Errorf("jetlock %q: %q, want %q", tc.args, r.stderr, tc.want)
		}
	}
	user, pw := cluster.User(devcluster.Admin) // may publish anything: nobody answers
	r := jl(t, "--user", user, "--password", pw, "--prefix", "nobody", "status", "voice:1")
	wantError(t, r, 69)
}

// errorLine is a --json error.
type errorLine struct {
	Error struct {
		Code     string          `json:"code"`
		Message  string          `json:"message"`
		ExitCode int             `json:"exit_code"`
		Holder   *streams.Holder `json:"holder"`
	} `json:"error"`
}

// With --json, every command that has it prints its errors as one JSON
// line on stdout, {"error":{"code","message","exit_code"}}, and nothing on
// stderr: bad input, the service's refusals, NATS's.
func TestJSONErrors(t *testing.T) {
	t.Parallel()
	const res = "json:err"
	held := jl(t, "acquire", "--json", "--owner", "holder", res)
	wantCode(t, held, 0)
	lease := decode[streams.LeaseResponse](t, held.stdout)
	t.Cleanup(func() { jl(t, "release", "--lease-id", lease.LeaseID, res) })
	for _, tc := range []struct {
		args []string
		code int
		kind string
	}{
		{[]string{"acquire", "--json", res}, 75, "locked"},
		{[]string{"acquire", "--json", "--ttl", "1h", res}, 2, "invalid_request"},
		{[]string{"acquire", "--json", "--ttl", "25h", res}, 2, "usage"},
		{[]string{"acquire", "--json", "--bogus", res}, 2, "usage"},
		{[]string{"acquire", "--json", "--env", res}, 2, "usage"},
		{[]string{"renew", "--json", "--lease-id", "0a", res}, 79, "lease_lost"},
		{[]string{"renew", "--json", "--lease-id", "not hex!", res}, 2, "usage"},
		{[]string{"release", "--json", res}, 2, "usage"},
		{[]string{"status", "--json", "bad res"}, 2, "usage"},
		{[]string{"--prefix", "nobody", "status", "--json", res}, 77, "permission_denied"},
		{[]string{"ls", "--json", "bad prefix"}, 2, "usage"},
		{[]string{"revoke", "--json", res, "--reason", "x"}, 77, "permission_denied"},
		{[]string{"watch", "--json", "--for", "5s"}, 77, "permission_denied"},
		{[]string{"--server", "nats://127.0.0.1:1", "status", "--json", res}, 69, "unavailable"},
	} {
		r := jl(t, tc.args...)
		if r.code != tc.code || r.stderr != "" {
			t.Errorf("jetlock %q: exit %d, stderr %q; want %d and nothing on stderr", tc.args, r.code, r.stderr, tc.code)
			continue
		}
		e := decode[errorLine](t, r.stdout)
		if e.Error.Code != tc.kind || e.Error.ExitCode != tc.code || e.Error.Message == "" || strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("jetlock %q: %s, want code %s, exit_code %d", tc.args, r.stdout, tc.kind, tc.code)
		}
		wantOneVoice(t, "jetlock: "+e.Error.Code+": "+e.Error.Message)
		if tc.kind == "locked" && (e.Error.Holder == nil || e.Error.Holder.Owner != "holder" || e.Error.Holder.Token != lease.Token) {
			t.Errorf("jetlock %q: holder %+v", tc.args, e.Error.Holder)
		}
	}
	// Without --json the same error is one line on stderr.
	r := jl(t, "acquire", res)
	wantError(t, r, 75)
	if r.stdout != "" {
		t.Fatalf("acquire without --json printed %q", r.stdout)
	}
}

// acquire's owner is HOST:PID unless --owner names one, as run's is.
func TestAcquireOwnerDefaultsToHostPID(t *testing.T) {
	t.Parallel()
	const res = "owner:default"
	r := jl(t, "acquire", "--json", res)
	wantCode(t, r, 0)
	g := decode[streams.LeaseResponse](t, r.stdout)
	t.Cleanup(func() { jl(t, "release", "--lease-id", g.LeaseID, res) })
	host, _ := os.Hostname()
	st := status(t, newClient(t), res)
	pid, ok := strings.CutPrefix(st.Owner, host+":")
	if n, err := strconv.Atoi(pid); !ok || err != nil || n <= 0 {
		t.Fatalf("owner %q, want %s:PID", st.Owner, host)
	}
}

// 'eval "$(jetlock acquire --env --ttl 1m ...)"' then 'jetlock renew'
// renews for the TTL the script asked for (JETLOCK_TTL), not the
// service's default; --ttl still overrides it.
func TestEnvTTLIsRenewsDefault(t *testing.T) {
	t.Parallel()
	const res = "script:envttl"
	dir := t.TempDir()
	script := filepath.Join(dir, "s.sh")
	body := `set -e
eval "$("$JETLOCK" --server "$URLS" acquire --env --ttl 1m ` + res + `)"
echo "$JETLOCK_TTL" > ` + filepath.Join(dir, "ttl") + `
"$JETLOCK" --server "$URLS" renew --json ` + res + ` > ` + filepath.Join(dir, "renew1") + `
"$JETLOCK" --server "$URLS" renew --json --ttl 2m ` + res + ` > ` + filepath.Join(dir, "renew2") + `
"$JETLOCK" --server "$URLS" release ` + res + `
`
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	sh := start(t, []string{"JETLOCK=" + bin, "URLS=" + urls}, "run", "script:envttl-outer", "--", "sh", script).wait(t, 60*time.Second)
	wantCode(t, sh, 0)
	if b, _ := os.ReadFile(filepath.Join(dir, "ttl")); string(b) != "1m\n" {
		t.Fatalf("JETLOCK_TTL %q, want 1m", b)
	}
	for file, want := range map[string]int64{"renew1": 60000, "renew2": 120000} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		var g struct {
			TTLms int64 `json:"ttl_ms"`
		}
		if err := json.Unmarshal(b, &g); err != nil || g.TTLms != want {
			t.Errorf("%s: %s, want ttl_ms %d", file, b, want)
		}
	}
	if st := status(t, newClient(t), res); st.Held {
		t.Fatalf("held after the script released: %+v", st)
	}
	// A bad JETLOCK_TTL is bad input, named as such.
	r := start(t, []string{"JETLOCK_TTL=soon", "JETLOCK_LEASE_ID=0a"}, "renew", res).wait(t, 30*time.Second)
	wantError(t, r, 2)
	if !strings.Contains(r.stderr, "JETLOCK_TTL") && !strings.Contains(r.stderr, "--ttl") {
		t.Fatalf("bad JETLOCK_TTL: %q", r.stderr)
	}
}

// holdAndQueue has the Go client hold res, and starts 'jetlock acquire
// --wait 1m FLAGS res' on it, returning once it waits in the queue.
func holdAndQueue(t *testing.T, res string, flags ...string) (*client.Lease, *proc) {
	t.Helper()
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := c.TryAcquire(ctx, res, client.TTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Release(ctx)
	})
	w := start(t, nil, append(append([]string{"acquire", "--wait", "1m"}, flags...), res)...)
	deadline := time.Now().Add(20 * time.Second)
	for status(t, c, res).Waiters != 1 {
		if time.Now().After(deadline) {
			t.Fatal("jetlock acquire --wait never queued")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return l, w
}
