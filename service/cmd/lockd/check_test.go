package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

func decodeReport(t *testing.T, out string) checkReport {
	t.Helper()
	var rep checkReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output %q: %v", out, err)
	}
	return rep
}

func settings(ds []streams.Drift) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Setting)
	}
	slices.Sort(out)
	return out
}

// lockd check, run as a process: exit 0 on a bucket as Ensure made it;
// exit 1 with the replicas, deny purge and high-water drifts of a bucket
// changed behind jetlock's back; --fix puts deny purge right (tightening)
// but not replicas, and refuses (exit 2, nothing changed) with read-only
// rights; exit 2 for bad flags and an unreachable server.
func TestCheck(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, err := jetstream.New(env.ConnectAs(devcluster.Store))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := streams.Ensure(ctx, js, streams.BucketConfig{}); err != nil {
		t.Fatal(err)
	}
	store := storeArgs(env)

	t.Run("fresh bucket", func(t *testing.T) {
		code, out, errOut := runBin(t, append([]string{"check"}, store...)...)
		if code != exitOK || !strings.Contains(out, "no drift") {
			t.Fatalf("check = %d, %q %q; want 0, no drift", code, out, errOut)
		}
		code, out, _ = runBin(t, append([]string{"check", "--json"}, store...)...)
		rep := decodeReport(t, out)
		if code != exitOK || len(rep.Drifts) != 0 || rep.Stream != "KV_jetlock" || !rep.Exists || rep.Leader == "" {
			t.Fatalf("check --json = %d, %+v", code, rep)
		}
	})

	// A bucket made as an older jetlock or `nats kv add` would (purges
	// allowed: the server refuses to turn deny_purge off on an update),
	// then scaled down to one replica through the JetStream API, with a
	// high-water mark above its sequence: a stream recreated behind the
	// service's back.
	sc := streams.BucketConfig{Bucket: "drifted"}.StreamConfig(1)
	sc.DenyPurge = false
	if _, err := js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	sc.Replicas = 1
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	meta, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "drifted_meta", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := meta.Put(ctx, "high_water", []byte("1000")); err != nil {
		t.Fatal(err)
	}
	drifted := append([]string{"check", "--bucket", "drifted", "--json"}, store...)

	t.Run("drifted bucket", func(t *testing.T) {
		code, out, _ := runBin(t, drifted...)
		rep := decodeReport(t, out)
		if want := []string{"deny purge", "last sequence", "replicas"}; code != exitFailed || !slices.Equal(settings(rep.Drifts), want) {
			t.Fatalf("check = %d, drifts %v; want 1, %v (%s)", code, settings(rep.Drifts), want, out)
		}
		if rep.Stream != "KV_drifted" || rep.HighWater != 1000 || rep.LastSeq != 0 {
			t.Fatalf("report %+v, want stream KV_drifted, high water 1000, last seq 0", rep)
		}
		for _, d := range rep.Drifts {
			if d.Setting == "replicas" && (d.Have != "1" || d.Want != "3" || d.Fixable) ||
				d.Setting == "deny purge" && (d.Have != "false" || !d.Fixable) {
				t.Fatalf("drift %+v", d)
			}
		}
		closed := fmt.Sprintf("nats://127.0.0.1:%d", freePorts(t, 1)[0])
		// --url: the name before --server still works, with a warning.
		code, out, errOut := runBin(t, "check", "--bucket", "drifted", "--json", "--url", closed)
		if code != exitUsage || out != "" || !strings.Contains(errOut, "lockd: warning: --url is deprecated: use --server\n") ||
			!strings.Contains(errOut, "lockd: connect "+closed+" (store connection): nats: no servers available for connection\n") {
			t.Fatalf("check without a reachable server = %d, %q %q; want 2, the deprecation warning and a connect error", code, out, errOut)
		}
	})

	t.Run("fix with read-only rights", func(t *testing.T) {
		ou, op := env.Cluster.User(devcluster.Inspector)
		args := []string{"check", "--bucket", "drifted", "--json", "--fix", "--server", env.Cluster.URLs(),
			"--store-user", ou, "--store-password", op, "--store-inbox-prefix", "_INBOX"}
		code, out, errOut := runBin(t, args...)
		rep := decodeReport(t, out)
		if code != exitUsage || rep.FixError == "" || len(rep.Fixed) != 0 || len(rep.Drifts) != 3 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Fatalf("check --fix as inspector = %d, %+v, stderr %q; want 2, a fix error on one line, 3 drifts", code, rep, errOut)
		}
	})

	t.Run("fix", func(t *testing.T) {
		code, out, _ := runBin(t, append(drifted, "--fix")...)
		rep := decodeReport(t, out)
		if code != exitFailed || !slices.Equal(settings(rep.Fixed), []string{"deny purge"}) ||
			!slices.Equal(settings(rep.Drifts), []string{"last sequence", "replicas"}) {
			t.Fatalf("check --fix = %d, fixed %v, remaining %v; want 1, [deny purge], [last sequence replicas]", code, settings(rep.Fixed), settings(rep.Drifts))
		}
		info, err := js.Stream(ctx, "KV_drifted")
		if err != nil {
			t.Fatal(err)
		}
		cfg := info.CachedInfo().Config
		if !cfg.DenyPurge || cfg.Replicas != 1 || !cfg.DenyDelete || cfg.MaxMsgsPerSubject != 1 {
			t.Fatalf("after --fix: deny purge %v, replicas %d, deny delete %v, history %d; want true, 1, true, 1",
				cfg.DenyPurge, cfg.Replicas, cfg.DenyDelete, cfg.MaxMsgsPerSubject)
		}
		code, out, _ = runBin(t, drifted...)
		if rep := decodeReport(t, out); code != exitFailed || !slices.Equal(settings(rep.Drifts), []string{"last sequence", "replicas"}) {
			t.Fatalf("check after --fix = %d, %v", code, settings(rep.Drifts))
		}
	})

	t.Run("missing bucket", func(t *testing.T) {
		code, out, _ := runBin(t, append([]string{"check", "--bucket", "nothere", "--json"}, store...)...)
		if rep := decodeReport(t, out); code != exitFailed || rep.Exists || !slices.Equal(settings(rep.Drifts), []string{"stream"}) {
			t.Fatalf("check of a missing bucket = %d, %+v", code, rep)
		}
	})

	t.Run("usage errors", func(t *testing.T) {
		for _, args := range [][]string{
			{"check", "--bogus"},
			{"check", "--bucket", "bad.name"},
			{"check", "--replicas", "1"}, // without --allow-single-replica
			{"check", "--timeout", "0s"},
			{"check", "--dev", "--dev-dir", t.TempDir()}, // no lockd --dev there
		} {
			code, out, errOut := runBin(t, args...)
			if code != exitUsage || out != "" || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.HasPrefix(errOut, "lockd: ") {
				t.Errorf("lockd %v = %d, stdout %q, stderr %q; want 2, nothing, one line", args, code, out, errOut)
			}
		}
	})
}

// lockd check --dev reaches the bucket of a running lockd --dev with the
// store user it wrote to the dev directory (mode 0600, removed when lockd
// stops).
func TestCheckDev(t *testing.T) {
	dir := t.TempDir()
	ports := freePorts(t, 3)
	l := startLockd(t, "--dev", "--dev-dir", dir, "--dev-ports", fmt.Sprintf("%d,%d,%d", ports[0], ports[1], ports[2]))
	st, err := os.Stat(filepath.Join(dir, devStoreFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("dev store file: %v, %v; want mode 0600", st, err)
	}
	code, out, errOut := runBin(t, "check", "--dev", "--dev-dir", dir, "--fix")
	if code != exitOK || !strings.Contains(out, "no drift") {
		t.Fatalf("check --dev = %d, %q %q; want 0, no drift", code, out, errOut)
	}
	if code := l.shutdown(t); code != exitOK {
		t.Fatalf("lockd --dev exited %d: %s", code, l.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, devStoreFile)); !os.IsNotExist(err) {
		t.Fatalf("dev store file left behind: %v", err)
	}
}
