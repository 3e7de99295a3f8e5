package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/streams"
)

// preflightTimeout bounds the one JetStream request of preflight.
const preflightTimeout = 5 * time.Second

// preflight finds, on the store connection, the misconfigurations that no
// retry mends: the service would otherwise retry the bucket forever,
// every two seconds, with no word of the fix. It returns a usage error
// naming the fix for
//
//   - a store user without the rights it needs: the server refuses its
//     first JetStream request, the inbox its reply comes to, or a request
//     of ensuring the bucket (which preflight does once, as the service
//     will: a read-only user gets this far);
//   - JetStream not enabled on the server (the server says so in its INFO,
//     and no server answers the JetStream API), or not for the store user's
//     account;
//   - more replicas than one server can hold: the server runs without a
//     cluster, and bc asks for more than one replica. With
//     --allow-single-replica, bc.Replicas becomes 1 instead, and preflight
//     logs it.
//
// Anything else (no quorum, no meta leader yet, a timeout) is left to the
// service, which retries.
func preflight(ctx context.Context, nc *nats.Conn, bc *streams.BucketConfig, log *slog.Logger) error {
	server := nc.ConnectedServerName()
	if server == "" {
		server = nc.ConnectedUrlRedacted()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	err, denied := watchDenied(ctx, nc, func(ctx context.Context) error {
		_, err := js.AccountInfo(ctx)
		return err
	})
	enabled, _ := nc.ConnectedServerJetStream()
	switch {
	case denied != nil:
		return usageError("%s", storeRightsMissing(denied, bc.Bucket))
	case errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return usageError("JetStream is not enabled for the store user's account on server %s: enable jetstream in that account (accounts { <ACCOUNT> { jetstream: enabled } }) in the server config", server)
	case !enabled && errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return usageError("JetStream is not enabled on the server %s (%s): enable jetstream in the server config (a jetstream { store_dir: ... } block, or nats-server --jetstream)", server, nc.ConnectedUrlRedacted())
	case err != nil:
		log.Debug("JetStream account info before ensuring the bucket", "err", err)
	}
	if replicas := cmp.Or(bc.Replicas, 3); replicas > 1 && nc.ConnectedClusterName() == "" {
		if !bc.AllowSingleReplica {
			return usageError("--replicas %d but the cluster has 1 server (%s runs without a cluster): start three servers (one per zone) or run with --replicas 1 --allow-single-replica", replicas, server)
		}
		bc.Replicas = 1
		log.Warn("the server runs without a cluster: the bucket gets 1 replica (--allow-single-replica); acknowledged state is lost when the server's storage is", "server", server)
	}
	// The bucket as the service will ensure it (idempotent): a store user
	// with read-only rights passes the account request above, and is
	// refused only here.
	err, denied = watchDenied(ctx, nc, func(ctx context.Context) error {
		_, err := streams.Ensure(ctx, js, *bc)
		return err
	})
	switch {
	case denied != nil:
		return usageError("%s", storeRightsMissing(denied, bc.Bucket))
	case err != nil:
		log.Debug("ensuring the bucket before serving", "err", err)
	}
	return nil
}

// watchDenied runs one JetStream request of preflight's, fn, within
// preflightTimeout. The server answers a request the user may not make, or
// whose reply it may not receive, with an asynchronous permission error
// and no reply; so while fn waits, watchDenied polls the connection's last
// error, and returns a permission violation as denied at once rather than
// after the timeout.
func watchDenied(ctx context.Context, nc *nats.Conn, fn func(context.Context) error) (err, denied error) {
	ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
				return err, last
			}
			return err, nil
		case <-tick.C:
			if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
				cancel()
				return <-done, last
			}
		}
	}
}

// deniedRE finds what the server refused in a permission violation:
// `Permissions Violation for Publish to "$JS.API.INFO"`, or for
// `Subscription to "_INBOX_x.abc.*"`.
var deniedRE = regexp.MustCompile(`(Publish|Subscription) to "([^"]+)"`)

// storeRightsMissing says which right the store user lacks, and which
// rights it needs (deploy/nats/accounts.conf, STORE_PERMISSIONS).
func storeRightsMissing(denied error, bucket string) string {
	bucket = cmp.Or(bucket, streams.DefaultBucket)
	needs := fmt.Sprintf("the store user (--store-creds, --store-nkey or --store-user; JETLOCK_STORE_*) needs publish on "+
		"$JS.API.>, $KV.%s.>, $KV.%s_meta.>, $JS.ACK.> and $JS.FC.>, and subscribe on its inbox prefix "+
		"(--store-inbox-prefix, default %s) followed by .> (deploy/nats/accounts.conf, STORE_PERMISSIONS)",
		bucket, bucket, streams.StoreInboxPrefix)
	m := deniedRE.FindStringSubmatch(denied.Error())
	switch {
	case m == nil:
		return fmt.Sprintf("the server refused the store connection a right it needs (%s): %s", denied, needs)
	case m[1] == "Subscription":
		prefix, _, _ := strings.Cut(m[2], ".")
		return fmt.Sprintf("the store user may not subscribe to its inbox %s.> (the server refused %q): %s", prefix, m[2], needs)
	default:
		return fmt.Sprintf("the store user may not publish to %s (the server refused it): %s", m[2], needs)
	}
}
