//go:build unix

package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/streams"
)

// tokensOf parses a JETLOCK_TOKENS value.
func tokensOf(t *testing.T, s string) map[string]uint64 {
	t.Helper()
	var m map[string]uint64
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("JETLOCK_TOKENS %q: %v", s, err)
	}
	return m
}

// run with several resources holds them as one set for the command: each
// token in its environment, per resource and as JSON, no JETLOCK_TOKEN,
// nothing inherited from an outer lease; both are released when it exits.
func TestRunSetHandsEveryTokenToTheCommand(t *testing.T) {
	t.Parallel()
	// The brief's one-liner: the tokens on the command's stdout.
	r := jl(t, "run", "runset:b", "runset:a", "--", "sh", "-c", `echo $JETLOCK_TOKEN_1 $JETLOCK_TOKEN_2 $JETLOCK_TOKENS`)
	wantPassthrough(t, r, 0)
	f := strings.Fields(r.stdout)
	if len(f) != 3 {
		t.Fatalf("the command printed %q", r.stdout)
	}
	tokens := tokensOf(t, f[2])
	if len(tokens) != 2 || strconv.FormatUint(tokens["runset:a"], 10) != f[0] || strconv.FormatUint(tokens["runset:b"], 10) != f[1] ||
		tokens["runset:a"] == 0 || tokens["runset:b"] == 0 {
		t.Fatalf("JETLOCK_TOKEN_1 %s, JETLOCK_TOKEN_2 %s, JETLOCK_TOKENS %s: want runset:a's and runset:b's tokens", f[0], f[1], f[2])
	}
	c := newClient(t)
	for _, res := range []string{"runset:a", "runset:b"} {
		if st := status(t, c, res); st.Held {
			t.Fatalf("%s still held after the command exited: %+v", res, st)
		}
	}

	// While the command runs: the service holds both with those tokens,
	// as a set; an outer lease's variables are gone.
	dir := t.TempDir()
	out, started, finish := filepath.Join(dir, "out"), filepath.Join(dir, "started"), filepath.Join(dir, "finish")
	inherited := []string{"JETLOCK_TOKEN=999", "JETLOCK_RESOURCE=outer", "JETLOCK_TOKEN_3=7", "JETLOCK_RESOURCE_3=outer", "JETLOCK_TOKEN_X=kept"}
	p := start(t, inherited, "run", "--ttl", "5s", "--owner", "setrun", "runset:d", "runset:c", "--", "sh", "-c",
		`echo "$JETLOCK_RESOURCE_1 $JETLOCK_TOKEN_1 $JETLOCK_RESOURCE_2 $JETLOCK_TOKEN_2 $JETLOCK_TOKENS ${JETLOCK_TOKEN-unset} ${JETLOCK_RESOURCE-unset} ${JETLOCK_TOKEN_3-unset} ${JETLOCK_RESOURCE_3-unset} $JETLOCK_TOKEN_X ${#JETLOCK_LEASE_ID}" > `+out+`
touch `+started+`; i=0; while [ ! -e `+finish+` ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done`)
	waitFile(t, started, 20*time.Second)
	b, _ := os.ReadFile(out)
	f = strings.Fields(string(b))
	if len(f) != 11 || f[0] != "runset:c" || f[2] != "runset:d" || f[5] != "unset" || f[6] != "unset" || f[7] != "unset" ||
		f[8] != "unset" || f[9] != "kept" || f[10] == "0" {
		t.Fatalf("the set's environment: %q", b)
	}
	tokens = tokensOf(t, f[4])
	for i, res := range []string{"runset:c", "runset:d"} {
		st := status(t, c, res)
		if !st.Held || st.Owner != "setrun" || st.SetSize != 2 || strconv.FormatUint(st.Token, 10) != f[1+2*i] || tokens[res] != st.Token {
			t.Fatalf("status of %s: %+v; the command got token %s, JETLOCK_TOKENS %s", res, st, f[1+2*i], f[4])
		}
	}
	if err := os.WriteFile(finish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wantPassthrough(t, p.wait(t, 20*time.Second), 0)
	for _, res := range []string{"runset:c", "runset:d"} {
		if st := status(t, c, res); st.Held {
			t.Fatalf("%s still held after the command exited: %+v", res, st)
		}
	}

	// One resource: JETLOCK_TOKEN as ever, and the set's variables too.
	r = start(t, []string{"JETLOCK_TOKEN_2=7"}, "run", "runset:single", "--", "sh", "-c",
		`echo $JETLOCK_RESOURCE $JETLOCK_TOKEN $JETLOCK_RESOURCE_1 $JETLOCK_TOKEN_1 ${JETLOCK_TOKEN_2-unset} $JETLOCK_TOKENS`).wait(t, 30*time.Second)
	wantPassthrough(t, r, 0)
	f = strings.Fields(r.stdout)
	if len(f) != 6 || f[0] != "runset:single" || f[2] != "runset:single" || f[1] != f[3] || f[4] != "unset" ||
		f[5] != fmt.Sprintf(`{"runset:single":%s}`, f[1]) {
		t.Fatalf("a single lease's environment: %q", r.stdout)
	}
}

// run of a set with a held member exits 75 naming the holder, starts
// nothing and leaves the free member free; with --wait it runs once the
// member is released.
func TestRunSetLockedAndWaits(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	held, err := c.TryAcquire(ctx, "runset2:b", client.Owner("bob"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	r := jl(t, "run", "runset2:a", "runset2:b", "--", "touch", marker)
	wantError(t, r, 75)
	want := fmt.Sprintf("jetlock: locked: 1 of the set's 2 resources held by other leases (runset2:b: owner bob, token %d)\n", held.Token())
	if r.stderr != want {
		t.Fatalf("stderr %q, want %q", r.stderr, want)
	}
	wantCode(t, jl(t, "run", "--wait", "300ms", "runset2:a", "runset2:b", "--", "touch", marker), 75)
	if exists(marker) {
		t.Fatal("a run refused its set still started its command")
	}
	if st := status(t, c, "runset2:a"); st.Held || st.Waiters != 0 {
		t.Fatalf("the free member after refused runs: %+v", st)
	}

	// --json of acquire names every holder.
	r = jl(t, "acquire", "--json", "runset2:b", "runset2:a")
	var e struct {
		Error struct {
			Code     string           `json:"code"`
			Message  string           `json:"message"`
			ExitCode int              `json:"exit_code"`
			Holder   *streams.Holder  `json:"holder"`
			Holders  []streams.Holder `json:"holders"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil || r.code != 75 || e.Error.Code != "locked" ||
		len(e.Error.Holders) != 1 || e.Error.Holders[0].Resource != "runset2:b" || e.Error.Holders[0].Owner != "bob" ||
		e.Error.Holders[0].Token != held.Token() || e.Error.Holder == nil || e.Error.Holder.Resource != "runset2:b" {
		t.Fatalf("acquire --json of a held set: exit %d, %s (%v)", r.code, r.stdout, err)
	}

	waiter := start(t, nil, "run", "--wait", "30s", "runset2:b", "runset2:a", "--", "sh", "-c", `echo $JETLOCK_TOKENS > `+marker)
	deadline := time.Now().Add(10 * time.Second)
	for status(t, c, "runset2:b").Waiters != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the set's run never queued")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantPassthrough(t, waiter.wait(t, 20*time.Second), 0)
	b, _ := os.ReadFile(marker)
	if tokens := tokensOf(t, strings.TrimSpace(string(b))); len(tokens) != 2 || tokens["runset2:b"] <= held.Token() {
		t.Fatalf("the waiting run got %q, want runset2:b's token above %d", b, held.Token())
	}
}

// acquire with several resources hands the set to a script: --json (with
// a token per resource), --env for eval, renew and release with the same
// names.
func TestAcquireSetForAScript(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	r := jl(t, "acquire", "--json", "--ttl", "5s", "acqset:b", "acqset:a")
	wantCode(t, r, 0)
	g := decode[streams.SetLeaseResponse](t, r.stdout)
	if g.LeaseID == "" || g.TTLms != 5000 || len(g.Resources) != 2 || g.Resources[0].Resource != "acqset:a" || g.Resources[1].Resource != "acqset:b" {
		t.Fatalf("acquire --json of a set: %s", r.stdout)
	}
	for _, m := range g.Resources {
		if st := status(t, c, m.Resource); !st.Held || st.Token != m.Token || st.SetSize != 2 {
			t.Fatalf("status of %s: %+v, want token %d", m.Resource, st, m.Token)
		}
	}
	env := []string{"JETLOCK_LEASE_ID=" + g.LeaseID}
	r = start(t, env, "renew", "--json", "--ttl", "8s", "acqset:a", "acqset:b").wait(t, 30*time.Second)
	wantCode(t, r, 0)
	if rv := decode[struct {
		TTLms     int64               `json:"ttl_ms"`
		ExpiresAt string              `json:"expires_at"`
		HoldUntil string              `json:"hold_until"`
		Resources []streams.SetMember `json:"resources"`
	}](t, r.stdout); rv.TTLms != 8000 || len(rv.Resources) != 2 || rv.Resources[0] != g.Resources[0] || rv.Resources[1] != g.Resources[1] {
		t.Fatalf("renew --json of a set: %s", r.stdout)
	}
	r = start(t, env, "renew", "acqset:a", "acqset:c").wait(t, 30*time.Second)
	wantError(t, r, 2) // not the set of the lease: the service says so (issue 39)
	if !strings.Contains(r.stderr, "lock set") {
		t.Fatalf("renew naming another set: %q", r.stderr)
	}
	r = start(t, env, "release", "--json", "acqset:b", "acqset:a").wait(t, 30*time.Second)
	wantCode(t, r, 0)
	if rel := decode[streams.SetReleaseResponse](t, r.stdout); !rel.Released || len(rel.Resources) != 2 || rel.Resources[0] != "acqset:a" {
		t.Fatalf("release --json of a set: %s", r.stdout)
	}
	r = start(t, env, "release", "acqset:b", "acqset:a").wait(t, 30*time.Second)
	if wantCode(t, r, 0); !strings.Contains(r.stdout, "already ended") {
		t.Fatalf("second release: %q", r.stdout)
	}

	// --env, evaluated by a shell that held a single lease before; the
	// script's renewal keeps the set past its first TTL (3s), so that the
	// release finds it held.
	dir := t.TempDir()
	script := filepath.Join(dir, "s.sh")
	body := `set -e
export JETLOCK_RESOURCE=old JETLOCK_TOKEN=1
eval "$("$JETLOCK" --server "$URLS" acquire --env --ttl 3s acqset:y acqset:x)"
echo "$JETLOCK_RESOURCE_1 $JETLOCK_TOKEN_1 $JETLOCK_RESOURCE_2 $JETLOCK_TOKEN_2 $JETLOCK_TOKENS ${JETLOCK_TOKEN-unset} ${JETLOCK_RESOURCE-unset} $JETLOCK_TTL" > ` + filepath.Join(dir, "out") + `
sleep 1.5
"$JETLOCK" --server "$URLS" renew acqset:x acqset:y
sleep 2
"$JETLOCK" --server "$URLS" release acqset:y acqset:x
`
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	sh := start(t, []string{"JETLOCK=" + bin, "URLS=" + urls}, "run", "acqset:outer", "--", "sh", script).wait(t, 30*time.Second)
	wantCode(t, sh, 0)
	if !strings.Contains(sh.stdout, "renewed acqset:x acqset:y: tokens acqset:x=") || !strings.Contains(sh.stdout, "released acqset:y acqset:x") {
		t.Fatalf("the script printed %q", sh.stdout)
	}
	out, _ := os.ReadFile(filepath.Join(dir, "out"))
	f := strings.Fields(string(out))
	if len(f) != 8 || f[0] != "acqset:x" || f[2] != "acqset:y" || f[5] != "unset" || f[6] != "unset" || f[7] != "3s" {
		t.Fatalf("--env handed the script %q", out)
	}
	if tokens := tokensOf(t, f[4]); strconv.FormatUint(tokens["acqset:x"], 10) != f[1] || strconv.FormatUint(tokens["acqset:y"], 10) != f[3] {
		t.Fatalf("--env's tokens %q", out)
	}
	for _, res := range []string{"acqset:x", "acqset:y"} {
		if st := status(t, c, res); st.Held {
			t.Fatalf("%s held after the script released: %+v", res, st)
		}
	}
}

// Bad sets are bad input: exit 2, nothing started.
func TestBadSetsExitTwo(t *testing.T) {
	t.Parallel()
	marker := filepath.Join(t.TempDir(), "ran")
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf("bad:set%d", i)
	}
	for _, args := range [][]string{
		{"run", "bad:a", "bad:a", "--", "touch", marker},
		{"run", "bad:a", "bad:b", "--wait", "1s", "--", "touch", marker},
		{"run", "bad:a", "bad res", "--", "touch", marker},
		{"run", "bad:a", "bad:b", "--"},
		append(append([]string{"run"}, many...), "--", "touch", marker),
		{"acquire", "bad:a", "bad:b", "bad:a"},
		{"acquire", "bad:a", ".bad"},
		{"renew", "--lease-id", "0a", "bad:a", "bad:a"},
		{"release", "--lease-id", "0a", "bad:a", "bad/"},
	} {
		r := jl(t, args...)
		wantError(t, r, 2)
		if !strings.HasPrefix(r.stderr, "jetlock: usage: ") {
			t.Errorf("jetlock %q: %q", args, r.stderr)
		}
	}
	if exists(marker) {
		t.Fatal("a bad run started its command")
	}
}
