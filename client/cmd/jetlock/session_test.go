package main_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// ls, status and watch show which leases a session holds: by the
// session's owner where it is shown, "session" where it is not, and never
// the session id.
func TestLsAndWatchShowSessions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := start(t, nil, inspector("watch", "--json", "--for", "12s", "sess-cli:")...)
	time.Sleep(1500 * time.Millisecond) // the watcher is up

	// A session of the caller's own NATS user, one of another user's (the
	// app account's), and a lease of its own.
	mine, err := newClient(t).NewSession(ctx, client.SessionTTL(5*time.Second), client.SessionOwner("worker"))
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close() //nolint:errcheck
	if _, err := mine.Acquire(ctx, "sess-cli:mine", client.Owner("job")); err != nil {
		t.Fatal(err)
	}
	user, pw := cluster.User(devcluster.App)
	appNC, err := nats.Connect(urls, nats.UserInfo(user, pw))
	if err != nil {
		t.Fatal(err)
	}
	defer appNC.Close()
	app, err := client.New(appNC)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := app.NewSession(ctx, client.SessionTTL(time.Second), client.SessionOwner("other-team"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := theirs.Acquire(ctx, "sess-cli:theirs"); err != nil {
		t.Fatal(err)
	}
	plain := jl(t, "acquire", "--json", "--ttl", "30s", "--owner", "plain", "sess-cli:plain")
	wantCode(t, plain, 0)
	plainID := decode[streams.LeaseResponse](t, plain.stdout).LeaseID

	ls := jl(t, "ls", "sess-cli:")
	wantCode(t, ls, 0)
	lines := strings.Split(strings.TrimSpace(ls.stdout), "\n")
	if len(lines) != 4 || !regexp.MustCompile(`^RESOURCE\s+OWNER\s+TOKEN\s+EXPIRES IN\s+WAITERS\s+SESSION$`).MatchString(lines[0]) {
		t.Fatalf("ls output:\n%s", ls.stdout)
	}
	for i, want := range []string{`^sess-cli:mine\s+job\s+\d+\s+\S+\s+0\s+worker$`, `^sess-cli:plain\s+plain\s+\d+\s+\S+\s+0\s+-$`,
		`^sess-cli:theirs\s+\(not shown\)\s+\d+\s+\S+\s+0\s+session$`} { // another user's lease: held, its owner hidden
		if !regexp.MustCompile(want).MatchString(lines[i+1]) {
			t.Fatalf("ls row %q, want %s", lines[i+1], want)
		}
	}
	lsJSON := jl(t, "ls", "--json", "sess-cli:")
	wantCode(t, lsJSON, 0)
	leases := decode[streams.ListResponse](t, lsJSON.stdout).Leases
	if len(leases) != 3 || !leases[0].InSession || leases[0].SessionOwner != "worker" || leases[1].InSession ||
		!leases[2].InSession || leases[2].SessionOwner != "" {
		t.Fatalf("ls --json: %s", lsJSON.stdout)
	}
	st := jl(t, "status", "sess-cli:mine")
	wantCode(t, st, 0)
	if !strings.Contains(st.stdout, `held by "job" in session "worker", token `) {
		t.Fatalf("status: %q", st.stdout)
	}
	stJSON := jl(t, "status", "--json", "sess-cli:theirs")
	wantCode(t, stJSON, 0)
	if r := decode[streams.StatusResponse](t, stJSON.stdout); !r.InSession || r.SessionOwner != "" {
		t.Fatalf("status --json of another user's session lease: %s", stJSON.stdout)
	}
	for _, out := range []string{ls.stdout, lsJSON.stdout, st.stdout, stJSON.stdout} {
		if strings.Contains(out, mine.ID()) || strings.Contains(out, theirs.ID()) || strings.Contains(out, mine.ID()[:streams.SessionHashLen]) {
			t.Fatal("a session id shown")
		}
	}

	// Closing a session releases its lease; a session nobody keeps alive
	// expires with its lease.
	if err := mine.Close(); err != nil {
		t.Fatal(err)
	}
	appNC.Close()
	wantCode(t, jl(t, "release", "--lease-id", plainID, "sess-cli:plain"), 0)

	res := w.wait(t, 30*time.Second)
	wantCode(t, res, 0)
	for _, id := range []string{mine.ID(), theirs.ID()} {
		if strings.Contains(res.stdout, id[:streams.SessionHashLen]) || strings.Contains(res.stdout, id[streams.SessionHashLen:]) {
			t.Fatal("watch printed a session id")
		}
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
		ev := decode[watchLine](t, line)
		session := "-"
		if ev.InSession {
			session = "session:" + ev.SessionOwner
		}
		got = append(got, ev.Event+" "+ev.Resource+" "+ev.Owner+" "+session)
	}
	want := map[string]bool{
		"granted sess-cli:mine job session:worker":    true,
		"released sess-cli:mine job session:worker":   true,
		"granted sess-cli:theirs  session:other-team": true,
		"expired sess-cli:theirs  session:other-team": true,
		"granted sess-cli:plain plain -":              true,
		"released sess-cli:plain plain -":             true,
	}
	for _, g := range got {
		if !want[g] {
			t.Fatalf("unexpected watch event %q; all:\n%s", g, strings.Join(got, "\n"))
		}
		delete(want, g)
	}
	if len(want) != 0 {
		t.Fatalf("watch events missing: %v; got:\n%s", want, strings.Join(got, "\n"))
	}
}
