package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// Bad input to every command is one line on stderr and exit 2, before
// anything connects or starts: a run's command never runs and no lease
// is taken.
func TestBadInputExitsTwoAndStartsNothing(t *testing.T) {
	t.Parallel()
	marker := filepath.Join(t.TempDir(), "ran")
	long := strings.Repeat("a", 201)
	for _, args := range [][]string{
		{},
		{"bogus"},
		{"--bogus", "status", "bad:1"},
		{"--timeout", "0s", "status", "bad:1"},
		{"run", "bad:1"},
		{"run", "bad:1", "--"},
		{"run", "--bogus", "bad:1", "--", "touch", marker},
		{"run", "bad res", "--", "touch", marker},
		{"run", ".bad", "--", "touch", marker},
		{"run", long, "--", "touch", marker},
		{"run", "--ttl", "500ms", "bad:1", "--", "touch", marker},
		{"run", "--ttl", "25h", "bad:1", "--", "touch", marker},
		{"run", "--ttl", "1500us", "bad:1", "--", "touch", marker},
		{"run", "--wait=-1s", "bad:1", "--", "touch", marker},
		{"run", "--max-hold", "100ms", "bad:1", "--", "touch", marker},
		{"run", "--grace", "0s", "bad:1", "--", "touch", marker},
		{"run", "--ttl", "soon", "bad:1", "--", "touch", marker},
		{"run", "--owner", "a\x01b", "bad:1", "--", "touch", marker},
		{"run", "--request-id", strings.Repeat("r", 129), "bad:1", "--", "touch", marker},
		{"acquire"},
		{"acquire", "--bogus", "bad:1"},
		{"acquire", "bad/"},
		{"acquire", "--ttl", "0.2s", "bad:1"},
		{"renew", "bad:1"},
		{"renew", "--lease-id", "0a", "bad res"},
		{"renew", "--lease-id", "0a", "--ttl", "10ms", "bad:1"},
		{"renew", "--lease-id", "0a", "--bogus", "bad:1"},
		{"renew", "--lease-id", "not hex!", "bad:1"},
		{"renew", "--lease-id", "0A", "bad:1"},
		{"release", "bad:1"},
		{"release", "--lease-id", strings.Repeat("a", 65), "bad:1"},
		{"release", "--lease-id", "0a", "--bogus", "bad:1"},
		{"release", "--lease-id", "not hex!", "bad:1"},
		{"status"},
		{"status", "bad res"},
		{"status", "--bogus", "bad:1"},
		{"ls", "bad prefix"},
		{"ls", "--bogus"},
		{"ls", "a", "b"},
		{"revoke", "bad:1"},
		{"revoke", "bad res", "--reason", "x"},
		{"revoke", "bad:1", "--reason", ""},
		{"revoke", "--bogus", "bad:1", "--reason", "x"},
		{"watch", "bad prefix"},
		{"watch", "--for=-1s"},
		{"watch", "--bucket", "no.dots", "--for", "1s"},
		{"watch", "--bogus"},
	} {
		r := jl(t, args...)
		if r.code != 2 {
			t.Errorf("jetlock %q: exit %d, want 2; stderr %q", args, r.code, r.stderr)
			continue
		}
		if lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "jetlock: ") {
			t.Errorf("jetlock %q: stderr is not one jetlock line: %q", args, r.stderr)
		}
		if r.stdout != "" {
			t.Errorf("jetlock %q printed %q", args, r.stdout)
		}
		if !strings.HasPrefix(r.stderr, "jetlock: usage: ") {
			t.Errorf("jetlock %q: %q, want a usage error", args, r.stderr)
		}
		wantOneVoice(t, r.stderr)
	}
	if exists(marker) {
		t.Fatal("a refused run started its command")
	}
	if st := status(t, newClient(t), "bad:1"); st.Held || st.Waiters != 0 {
		t.Fatalf("bad input left state behind: %+v", st)
	}
}

// A service that cannot be reached is exit 69, at once.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	marker := filepath.Join(t.TempDir(), "ran")
	user, pw := cluster.User(devcluster.Admin) // may publish anything: nobody answers
	for _, args := range [][]string{
		{"--user", user, "--password", pw, "--prefix", "nobody", "run", "un:1", "--", "touch", marker},
		{"--user", user, "--password", pw, "--prefix", "nobody", "status", "un:1"},
		{"--server", "nats://127.0.0.1:1", "run", "un:1", "--", "touch", marker},
	} {
		r := jl(t, args...)
		wantError(t, r, 69)
		if !strings.HasPrefix(r.stderr, "jetlock: unavailable: ") || r.took > 15*time.Second {
			t.Errorf("jetlock %q: %q after %v", args, r.stderr, r.took)
		}
	}
	if exists(marker) {
		t.Fatal("a run without a service started its command")
	}
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("output %q: %v", s, err)
	}
	return v
}

// The script commands' --json output is the wire JSON; only acquire shows
// the lease id; a lease renewed by the script outlives its TTL, and one
// not renewed ends.
func TestScriptCommandsJSON(t *testing.T) {
	t.Parallel()
	const res = "script:json"
	r := jl(t, "acquire", "--json", "--ttl", "2s", "--owner", "cron", res)
	wantCode(t, r, 0)
	g := decode[streams.LeaseResponse](t, r.stdout)
	if g.Resource != res || g.LeaseID == "" || g.Token == 0 || g.TTLms != 2000 || g.ExpiresAt == "" {
		t.Fatalf("acquire --json: %+v", g)
	}
	env := []string{"JETLOCK_LEASE_ID=" + g.LeaseID}

	r = jl(t, "status", "--json", res)
	wantCode(t, r, 0)
	st := decode[streams.StatusResponse](t, r.stdout)
	if !st.Held || st.Owner != "cron" || st.Token != g.Token {
		t.Fatalf("status --json: %+v", st)
	}
	r = jl(t, "acquire", res)
	wantCode(t, r, 75)

	// The script renews past the first TTL.
	for range 3 {
		time.Sleep(time.Second)
		r = start(t, env, "renew", "--json", "--ttl", "2s", res).wait(t, 30*time.Second)
		wantCode(t, r, 0)
		var raw map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
			t.Fatalf("renew --json %q: %v", r.stdout, err)
		}
		if _, ok := raw["lease_id"]; ok || raw["token"] != float64(g.Token) || raw["ttl_ms"] != float64(2000) {
			t.Fatalf("renew --json: %s", r.stdout)
		}
	}
	r = jl(t, "ls", "--json", "script:")
	wantCode(t, r, 0)
	list := decode[streams.ListResponse](t, r.stdout)
	if len(list.Leases) != 1 || list.Leases[0].Resource != res || list.Leases[0].Token != g.Token || strings.Contains(r.stdout, g.LeaseID) {
		t.Fatalf("ls --json: %s", r.stdout)
	}
	r = jl(t, "ls", "script:")
	if wantCode(t, r, 0); strings.Contains(r.stdout, g.LeaseID) || !strings.Contains(r.stdout, "cron") {
		t.Fatalf("ls: %s", r.stdout)
	}

	r = start(t, env, "release", "--json", res).wait(t, 30*time.Second)
	wantCode(t, r, 0)
	if rel := decode[streams.ReleaseResponse](t, r.stdout); !rel.Released || rel.Resource != res {
		t.Fatalf("release --json: %+v", rel)
	}
	r = start(t, env, "release", res).wait(t, 30*time.Second)
	if wantCode(t, r, 0); !strings.Contains(r.stdout, "already ended") {
		t.Fatalf("second release: %q", r.stdout)
	}
	r = start(t, env, "renew", res).wait(t, 30*time.Second)
	wantCode(t, r, 79)
	if !strings.HasPrefix(r.stderr, "jetlock: lease_lost: ") {
		t.Fatalf("renew after release: %q", r.stderr)
	}

	// --env output, evaluated by a shell, hands the lease to the script.
	dir := t.TempDir()
	script := filepath.Join(dir, "s.sh")
	body := `set -e
eval "$("$JETLOCK" --server "$URLS" acquire --env --ttl 2s ` + res + `)"
echo "$JETLOCK_RESOURCE $JETLOCK_TOKEN" > ` + filepath.Join(dir, "out") + `
"$JETLOCK" --server "$URLS" release "$JETLOCK_RESOURCE"
`
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	sh := start(t, []string{"JETLOCK=" + bin, "URLS=" + urls}, "run", "script:outer", "--", "sh", script).wait(t, 30*time.Second)
	wantCode(t, sh, 0)
	out, _ := os.ReadFile(filepath.Join(dir, "out"))
	if f := strings.Fields(string(out)); len(f) != 2 || f[0] != res {
		t.Fatalf("--env handed the script %q", out)
	}
	if s := status(t, newClient(t), res); s.Held {
		t.Fatalf("held after the script released: %+v", s)
	}

	// revoke --json of a free resource.
	r = jl(t, operator("revoke", "--json", res, "--reason", "test")...)
	wantCode(t, r, 0)
	if rv := decode[streams.RevokeResponse](t, r.stdout); rv.Revoked || rv.Resource != res {
		t.Fatalf("revoke --json: %+v", rv)
	}
}

type watchLine struct {
	Time      string `json:"time"`
	Event     string `json:"event"`
	Resource  string `json:"resource"`
	Owner     string `json:"owner"`
	Token     uint64 `json:"token"`
	ExpiresAt string `json:"expires_at"`
	Reason    string `json:"reason"`
	// A session's lease (see TestLsAndWatchShowSessions).
	InSession    bool   `json:"in_session"`
	SessionOwner string `json:"session_owner"`
}

// watch prints what is held, then grants, releases, expiries, revokes
// (with their reason) and hand-overs, never a lease id; without an
// inspector's rights it is a clear refusal.
func TestWatch(t *testing.T) {
	t.Parallel()
	r := jl(t, "watch", "--for", "5s", "watch:")
	wantCode(t, r, 77)
	if !strings.HasPrefix(r.stderr, "jetlock: permission_denied: ") || r.took > 5*time.Second {
		t.Fatalf("watch as a caller: %q after %v", r.stderr, r.took)
	}

	held := jl(t, "acquire", "--json", "--ttl", "30s", "--owner", "early", "watch:held")
	wantCode(t, held, 0)
	early := decode[streams.LeaseResponse](t, held.stdout)
	t.Cleanup(func() { jl(t, "release", "--lease-id", early.LeaseID, "watch:held") })

	w := start(t, nil, inspector("watch", "--json", "--for", "15s", "watch:")...)
	time.Sleep(1500 * time.Millisecond) // the watcher is up
	a := jl(t, "acquire", "--json", "--ttl", "1s", "--owner", "expirer", "watch:expire")
	wantCode(t, a, 0)
	exp := decode[streams.LeaseResponse](t, a.stdout)
	wantCode(t, jl(t, "run", "--owner", "runner", "watch:run", "--", "true"), 0)
	wantCode(t, jl(t, "acquire", "--ttl", "30s", "--owner", "victim", "watch:revoke"), 0)
	wantCode(t, jl(t, operator("revoke", "--reason", "stuck job", "watch:revoke")...), 0)
	// A hand-over: the holder releases while a caller waits.
	first := jl(t, "acquire", "--json", "--ttl", "30s", "--owner", "first", "watch:hand")
	wantCode(t, first, 0)
	waiter := start(t, nil, "acquire", "--json", "--wait", "10s", "--owner", "second", "watch:hand")
	testenv.Eventually(t, 10*time.Second, func() bool {
		st := jl(t, "status", "--json", "watch:hand")
		return st.code == 0 && decode[streams.StatusResponse](t, st.stdout).Waiters == 1
	}, "the second caller waits")
	wantCode(t, jl(t, "release", "--lease-id", decode[streams.LeaseResponse](t, first.stdout).LeaseID, "watch:hand"), 0)
	second := waiter.wait(t, 20*time.Second)
	wantCode(t, second, 0)
	wantCode(t, jl(t, "release", "--lease-id", decode[streams.LeaseResponse](t, second.stdout).LeaseID, "watch:hand"), 0)
	other := jl(t, "acquire", "--json", "--owner", "other", "other:x") // outside the prefix
	wantCode(t, other, 0)
	t.Cleanup(func() {
		jl(t, "release", "--lease-id", decode[streams.LeaseResponse](t, other.stdout).LeaseID, "other:x")
	})
	res := w.wait(t, 30*time.Second)
	wantCode(t, res, 0)
	for _, id := range []string{early.LeaseID, exp.LeaseID} {
		if strings.Contains(res.stdout, id) {
			t.Fatal("watch printed a lease id")
		}
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
		ev := decode[watchLine](t, line)
		if ev.Time == "" || ev.Token == 0 {
			t.Fatalf("event %s", line)
		}
		got = append(got, strings.TrimSpace(ev.Event+" "+ev.Resource+" "+ev.Owner+" "+ev.Reason))
	}
	want := []string{
		"held watch:held early",
		"granted watch:expire expirer",
		"granted watch:run runner",
		"released watch:run runner",
		"granted watch:revoke victim",
		"revoked watch:revoke victim stuck job",
		"granted watch:hand first",
		"handed-over watch:hand first",
		"granted watch:hand second",
		"released watch:hand second",
		"expired watch:expire expirer",
	}
	// In order per resource; resources interleave as their steps took.
	byResource := func(lines []string) map[string][]string {
		m := map[string][]string{}
		for _, l := range lines {
			f := strings.Fields(l)
			m[f[1]] = append(m[f[1]], l)
		}
		return m
	}
	if g, w := byResource(got), byResource(want); !reflect.DeepEqual(g, w) {
		t.Fatalf("watch events:\n%s\nwant (in this order per resource):\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Every command's --help has an example, and the top level lists the exit
// codes.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"run", "acquire", "renew", "release", "status", "ls", "revoke", "watch"} {
		r := jl(t, cmd, "--help")
		if r.code != 0 || !strings.Contains(r.stdout, "Example:\n") || !strings.Contains(r.stdout, "jetlock "+cmd) {
			t.Errorf("jetlock %s --help: exit %d\n%s", cmd, r.code, r.stdout)
		}
	}
	r := jl(t, "--help")
	for _, code := range []string{"2 bad input", "69 service unavailable", "75 locked", "77 permission denied", "79\nlease lost"} {
		if !strings.Contains(strings.ReplaceAll(r.stdout, "\n", " "), strings.ReplaceAll(code, "\n", " ")) {
			t.Errorf("jetlock --help lacks %q:\n%s", code, r.stdout)
		}
	}
}
