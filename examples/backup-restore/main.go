// Command backup-restore shows jetlock coordinating two services that
// work on the same user's data — a backup service and a restore service —
// and the fencing token stopping the one that was paused past its lease.
//
//	go run ./examples/backup-restore
//
// It starts the embedded three-node dev cluster (in a temporary
// directory) and the lock service in-process, runs the two workers, prints
// what happens, and exits. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "backup-restore:", err)
		os.Exit(1)
	}
}

// lockResource is the lock of one user's data. Both services take the
// same lock: a name that also carried the service's name (say
// "lock:backup:user123:service:backup") would give each service a lock of
// its own, and a backup and a restore of user123 would run at once.
func lockResource(user string) string { return "lock:backup:" + user }

const user = "user123"

// run plays the example, writing its narrative to out. It returns an error
// if anything fails or the story does not end as it must: the paused
// backup's stale write rejected and the restore's data intact.
func run(ctx context.Context, out io.Writer) error {
	say := newNarrator(out)

	dir, err := os.MkdirTemp("", "jetlock-backup-restore-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	cluster, err := devcluster.Start(devcluster.Options{Dir: filepath.Join(dir, "nats"), ReadyTimeout: 15 * time.Second})
	if err != nil {
		return err
	}
	defer cluster.Shutdown()
	stopService, err := startService(ctx, cluster)
	if err != nil {
		return err
	}
	defer stopService()
	say("setup", "three-node NATS cluster and the jetlock service are up")

	store, err := openStore(ctx, filepath.Join(dir, "userdata.db"))
	if err != nil {
		return err
	}
	defer store.Close()
	content, latest, err := store.User(ctx, user)
	if err != nil {
		return err
	}
	say("store", "%s: content %q, latest backup %s (%q)", user, content, latest, "photos v1")

	// The backup starts first; the restore is requested while it runs.
	// Both lock lock:backup:user123. If one worker fails, the other is
	// stopped.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		backupHolds   = make(chan struct{}) // closed once the backup holds the lock
		restoreQueued = make(chan struct{}) // closed once the restore found it locked
		restored      = make(chan struct{}) // closed once the restore has written
		wg            sync.WaitGroup
		backupErr     error
		restoreErr    error
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		if backupErr = backupWorker(wctx, say, cluster.URLs(), store, backupHolds, restoreQueued, restored); backupErr != nil {
			cancel()
		}
	}()
	go func() {
		defer wg.Done()
		select {
		case <-backupHolds:
		case <-wctx.Done():
			return
		}
		if restoreErr = restoreWorker(wctx, say, cluster.URLs(), store, restoreQueued, restored); restoreErr != nil {
			cancel()
		}
	}()
	wg.Wait()
	if err := errors.Join(backupErr, restoreErr); err != nil {
		return err
	}

	content, latest, err = store.User(ctx, user)
	if err != nil {
		return err
	}
	rejected := store.guard.Rejected()
	say("result", "%s: content %q, latest backup %s; stale writes rejected by the store: %d", user, content, latest, rejected)
	if content != "photos v1" || latest != "backup-1" || rejected != 1 {
		return fmt.Errorf("unexpected end state: content %q, latest backup %s, %d rejected", content, latest, rejected)
	}
	say("result", "the restore's work is intact. Without the fencing token the paused backup would have made")
	say("result", "backup-2, a copy of the pre-restore data, user123's latest backup.")
	return nil
}

// startService runs a jetlock service instance on cluster until the
// returned function is called, and waits until it answers through every
// node (interest in its subjects spreads between nodes asynchronously).
func startService(ctx context.Context, cluster *devcluster.Cluster) (stop func(), err error) {
	nc, storeNC, err := cluster.ConnectService()
	if err != nil {
		return nil, err
	}
	closeConns := func() { nc.Close(); storeNC.Close() }
	cfg := service.DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	// The service lets another caller in once a lease has gone unrenewed
	// for its TTL plus this grace (default 2s); shorter keeps the demo
	// short.
	cfg.ExpiryGrace = 500 * time.Millisecond
	svc, err := service.New(nc, storeNC, cfg)
	if err != nil {
		closeConns()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	stop = func() {
		cancel()
		<-done
		closeConns()
	}
	select {
	case <-svc.Ready():
	case err := <-done:
		cancel()
		closeConns()
		return nil, fmt.Errorf("lock service: %w", err)
	case <-ctx.Done():
		stop()
		return nil, ctx.Err()
	}
	if err := waitReachable(ctx, cluster); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

func waitReachable(ctx context.Context, cluster *devcluster.Cluster) error {
	for i := range devcluster.Size {
		nc, err := nats.Connect(cluster.ClientURL(i))
		if err != nil {
			return err
		}
		for {
			_, err = nc.Request(streams.Subject(streams.DefaultPrefix, streams.OpStatus), []byte(`{"resource":"ping"}`), time.Second)
			if err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		nc.Close()
		if err != nil {
			return fmt.Errorf("lock service unreachable through node %d: %w", i, err)
		}
	}
	return nil
}

// narrator prints timestamped lines "+1.23s  who      what"; safe for
// concurrent use.
type narrator func(who, format string, args ...any)

func newNarrator(out io.Writer) narrator {
	var mu sync.Mutex
	start := time.Now()
	return func(who, format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "%+6.2fs  %-8s %s\n", time.Since(start).Seconds(), who, strings.TrimSpace(fmt.Sprintf(format, args...)))
	}
}
