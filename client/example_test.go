package client_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/service"
)

func Example() {
	// A three-node cluster and the service, in process. In production both
	// run elsewhere and only the connection is yours.
	dir, _ := os.MkdirTemp("", "jetlock-example")
	defer os.RemoveAll(dir)
	cluster, err := devcluster.Start(devcluster.Options{Dir: dir})
	if err != nil {
		panic(err)
	}
	defer cluster.Shutdown()
	svcNC, storeNC, err := cluster.ConnectService()
	if err != nil {
		panic(err)
	}
	defer svcNC.Close()
	defer storeNC.Close()
	cfg := service.DefaultConfig()
	cfg.Logger = slog.New(slog.DiscardHandler)
	svc, _ := service.New(svcNC, storeNC, cfg)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	failed := make(chan error, 1)
	go func() { failed <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
	case err := <-failed:
		panic(err)
	}

	// Your application connects as itself; it needs no rights on the
	// bucket.
	nc, _ := nats.Connect(cluster.URLs())
	defer nc.Close()
	c, _ := client.New(nc)
	lease, err := c.Acquire(ctx, "lock:backup:user123", client.TTL(10*time.Second), client.Owner("backup-service"))
	if err != nil {
		panic(err)
	}
	fmt.Println("backup holds the lock:", lease.Token() > 0)

	// The restore service cannot get it meanwhile.
	_, err = c.TryAcquire(ctx, "lock:backup:user123", client.Owner("restore-service"))
	if he, ok := err.(*client.HeldError); ok {
		fmt.Println("restore sees holder:", he.Owner)
	}

	// Work, passing lease.Token() to every write, until done or lost.
	select {
	case <-lease.Lost():
		fmt.Println("lost the lock: stop writing")
	default:
	}
	if err := lease.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println("released")
	// Output:
	// backup holds the lock: true
	// restore sees holder: backup-service
	// released
}
