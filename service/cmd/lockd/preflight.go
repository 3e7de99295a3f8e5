package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	ictx, cancel := context.WithTimeout(ctx, preflightTimeout)
	_, err = js.AccountInfo(ictx)
	cancel()
	enabled, _ := nc.ConnectedServerJetStream()
	switch {
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
	return nil
}
