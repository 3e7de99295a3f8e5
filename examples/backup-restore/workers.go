package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/client/fence"
	"github.com/jetlock/jetlock/internal/netlink"
)

// backupTTL is the backup's lease TTL: short, so that the pause outlasts
// it within seconds. The client renews at a third of it.
const backupTTL = 2 * time.Second

// backupWorker takes user123's lock, reads the user's content to make
// snapshot backup-2, lets the restore ask for the lock, and is then paused — after it has checked that its
// lease is still held, before it records the snapshot. The pause lasts
// until the restore has written (a real pause has no such bound; tying it
// to the restore keeps the demo's timing deterministic). It then writes
// with its old token and must be rejected.
func backupWorker(ctx context.Context, say narrator, urls string, store *userStore, holds chan<- struct{}, restoreQueued, restored <-chan struct{}) error {
	link := &netlink.Link{}
	nc, err := nats.Connect(urls, nats.Name("backup-service"), nats.SetCustomDialer(link),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		return err
	}
	defer nc.Close()
	locks, err := client.New(nc)
	if err != nil {
		return err
	}

	lease, err := locks.Acquire(ctx, lockResource(user), client.TTL(backupTTL), client.Owner("backup-service"))
	if err != nil {
		return fmt.Errorf("backup: acquire: %w", err)
	}
	defer lease.Release(context.Background()) //nolint:errcheck // a lost lease needs no release
	say("backup", "acquired %s: token %d, TTL %v", lease.Resource(), lease.Token(), backupTTL)
	close(holds)

	content, _, err := store.User(ctx, user)
	if err != nil {
		return err
	}
	say("backup", "read %s's content %q for snapshot backup-2", user, content)
	select {
	case <-restoreQueued:
	case <-ctx.Done():
		return ctx.Err()
	}
	if lease.Context().Err() != nil {
		return errors.New("backup: lease lost before the pause")
	}
	say("backup", "lease still held (Lost not closed); about to record backup-2 as the latest backup ...")

	say("backup", "... and the process freezes (stop-the-world GC, VM pause): no lease renewals go out")
	paused := time.Now()
	link.Cut()
	select {
	case <-restored:
	case <-ctx.Done():
		return ctx.Err()
	}
	link.Restore()
	say("backup", "resumes after %.1fs, unaware; records backup-2 with token %d", time.Since(paused).Seconds(), lease.Token())

	err = store.RecordBackup(ctx, lease.Token(), user, "backup-2", content)
	var stale *fence.StaleTokenError
	switch {
	case errors.As(err, &stale):
		say("store", "REJECTED the backup's write: token %d is stale, token %d was already accepted", stale.Token, stale.Highest)
	case err == nil:
		return fmt.Errorf("backup: the stale write with token %d was accepted", lease.Token())
	default:
		return fmt.Errorf("backup: record backup-2: %w", err)
	}
	select {
	case <-lease.Lost():
		if !errors.Is(context.Cause(lease.Context()), client.ErrLeaseLost) {
			return fmt.Errorf("backup: lease context cause %v, want ErrLeaseLost", context.Cause(lease.Context()))
		}
		say("backup", "sees lease.Lost() closed (ErrLeaseLost: no renewal confirmed in time); abandons backup-2, will start over")
	default:
		return errors.New("backup: lease not reported lost after the pause")
	}
	return nil
}

// restoreWorker restores user123 from backup-1. It asks for the lock while
// the backup holds it, waits in the lock's queue, and restores once it is
// granted.
func restoreWorker(ctx context.Context, say narrator, urls string, store *userStore, queued, restored chan<- struct{}) error {
	nc, err := nats.Connect(urls, nats.Name("restore-service"), nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	locks, err := client.New(nc)
	if err != nil {
		return err
	}

	markQueued := sync.OnceFunc(func() { close(queued) })
	defer markQueued()
	say("restore", "%s asks to restore backup-1; taking %s", user, lockResource(user))
	opts := []client.AcquireOption{client.TTL(10 * time.Second), client.Owner("restore-service")}
	asked := time.Now()
	lease, err := locks.TryAcquire(ctx, lockResource(user), opts...)
	var held *client.HeldError
	if errors.As(err, &held) {
		say("restore", "locked by %s (token %d); waiting in the lock's queue", held.Owner, held.Token)
		markQueued()
		lease, err = locks.Acquire(ctx, lockResource(user), append(opts, client.Wait(15*time.Second))...)
	}
	if err != nil {
		return fmt.Errorf("restore: acquire: %w", err)
	}
	say("restore", "acquired %s after %.1fs: token %d", lease.Resource(), time.Since(asked).Seconds(), lease.Token())

	content, err := store.Restore(lease.Context(), lease.Token(), user, "backup-1")
	if err != nil {
		_ = lease.Release(context.Background())
		return fmt.Errorf("restore: %w", err)
	}
	say("restore", "restored %s to backup-1 (%q) with token %d: accepted", user, content, lease.Token())
	close(restored)
	if err := lease.Release(ctx); err != nil {
		return fmt.Errorf("restore: release: %w", err)
	}
	say("restore", "released the lock")
	return nil
}
