package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

type serveCmd struct {
	Dev      bool   `help:"Start an embedded three-node cluster (loopback, sync always, zones az:a/b/c, the users of deploy/) and serve on it." env:"JETLOCK_DEV"`
	DevDir   string `help:"Data directory of the dev cluster; kept across runs so tokens keep rising." default:".jetlock" env:"JETLOCK_DEV_DIR"`
	DevPorts []int  `help:"Client ports of the three dev nodes." default:"4222,4223,4224" env:"JETLOCK_DEV_PORTS"`

	connFlags `embed:""`

	Prefix      string        `help:"Subject prefix." default:"jetlock" env:"JETLOCK_PREFIX"`
	Bucket      string        `help:"KV bucket holding lock state." default:"jetlock" env:"JETLOCK_BUCKET"`
	Replicas    int           `help:"Bucket replicas (3 = one per zone; fewer needs --allow-single-replica)." default:"3" env:"JETLOCK_REPLICAS"`
	AllowR1     bool          `help:"Allow fewer than 3 replicas (loses acknowledged state when a server dies)." name:"allow-single-replica" env:"JETLOCK_ALLOW_SINGLE_REPLICA"`
	RetryWindow time.Duration `help:"How long an acquire retried with the same request_id is recognised." default:"2m" env:"JETLOCK_RETRY_WINDOW"`
	DefaultTTL  time.Duration `help:"TTL of a lease whose request names none." default:"30s" name:"default-ttl" env:"JETLOCK_DEFAULT_TTL"`
	MinTTL      time.Duration `help:"Smallest ttl_ms accepted." default:"1s" name:"min-ttl" env:"JETLOCK_MIN_TTL"`
	MaxTTL      time.Duration `help:"Largest ttl_ms accepted." default:"10m" name:"max-ttl" env:"JETLOCK_MAX_TTL"`
	MaxWait     time.Duration `help:"Largest wait_ms accepted." default:"5m" env:"JETLOCK_MAX_WAIT"`
	ExpiryGrace time.Duration `help:"Added to a lease's TTL before the service expires it." default:"2s" env:"JETLOCK_EXPIRY_GRACE"`

	MaxInFlight int           `help:"Requests processed at once." default:"4096" env:"JETLOCK_MAX_IN_FLIGHT"`
	MaxQueued   int           `help:"Requests waiting for a place beyond --max-in-flight; more are answered unavailable." default:"16384" env:"JETLOCK_MAX_QUEUED"`
	QueueWait   time.Duration `help:"How long a request may wait for a place before it is answered unavailable." default:"1s" env:"JETLOCK_QUEUE_WAIT"`
	OpTimeout   time.Duration `help:"Bound on the store work of one request: it ends within --queue-wait plus this of the request's receipt; keep that sum below the clients' request timeout." default:"3s" env:"JETLOCK_OP_TIMEOUT"`

	Metrics  string `help:"Serve Prometheus metrics on this address (e.g. 127.0.0.1:9090); empty disables." env:"JETLOCK_METRICS"`
	LogLevel string `help:"Log level: debug, info, warn, error." default:"info" enum:"debug,info,warn,error" env:"JETLOCK_LOG_LEVEL"`
}

func (c *serveCmd) Run() error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	nc, storeNC, url, cleanup, err := c.connect()
	if err != nil {
		return err
	}
	defer cleanup()
	if !c.Dev && c.sameUser() {
		log.Warn("the request and store connections use the same credentials: replies are then published with rights on the bucket; give the request connection a user without $JS/$KV rights (see deploy/)")
	}

	cfg := service.DefaultConfig()
	cfg.Prefix = c.Prefix
	cfg.Bucket = streams.BucketConfig{Bucket: c.Bucket, Replicas: c.Replicas, AllowSingleReplica: c.AllowR1, RetryWindow: c.RetryWindow}
	cfg.DefaultTTL, cfg.MinTTL, cfg.MaxTTL, cfg.MaxWait = c.DefaultTTL, c.MinTTL, c.MaxTTL, c.MaxWait
	cfg.ExpiryGrace = c.ExpiryGrace
	cfg.MaxInFlight, cfg.MaxQueued, cfg.QueueWait, cfg.OpTimeout = c.MaxInFlight, c.MaxQueued, c.QueueWait, c.OpTimeout
	cfg.Logger = log
	if c.Metrics != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		cfg.Registerer = reg
		srv := &http.Server{Addr: c.Metrics, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server", "err", err)
			}
		}()
		defer srv.Close()
	}
	svc, err := service.New(nc, storeNC, cfg)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
		c.printBanner(url)
	case err := <-done:
		return err
	}
	return <-done
}

// connect starts the dev cluster (with --dev) and opens the service's two
// connections. cleanup closes them and stops the cluster.
func (c *serveCmd) connect() (nc, storeNC *nats.Conn, url string, cleanup func(), err error) {
	if c.Dev {
		if len(c.DevPorts) != devcluster.Size {
			return nil, nil, "", nil, fmt.Errorf("--dev-ports needs %d ports", devcluster.Size)
		}
		cl, err := devcluster.Start(devcluster.Options{Dir: c.DevDir, ClientPorts: c.DevPorts, Prefix: c.Prefix})
		if err != nil {
			return nil, nil, "", nil, err
		}
		nc, storeNC, err := cl.ConnectService()
		if err != nil {
			cl.Shutdown()
			return nil, nil, "", nil, err
		}
		return nc, storeNC, cl.URLs(), func() { nc.Close(); storeNC.Close(); cl.Shutdown() }, nil
	}
	reqOpts, err := c.options(c.Requests, "jetlock-lockd", streams.ServiceInboxPrefix)
	if err != nil {
		return nil, nil, "", nil, err
	}
	storeOpts, err := c.options(c.Store, "jetlock-lockd-store", streams.StoreInboxPrefix)
	if err != nil {
		return nil, nil, "", nil, err
	}
	if nc, err = nats.Connect(c.URL, reqOpts...); err != nil {
		return nil, nil, "", nil, fmt.Errorf("connect %s: %w", c.URL, err)
	}
	if storeNC, err = nats.Connect(c.URL, storeOpts...); err != nil {
		nc.Close()
		return nil, nil, "", nil, fmt.Errorf("connect %s (store): %w", c.URL, err)
	}
	return nc, storeNC, c.URL, func() { nc.Close(); storeNC.Close() }, nil
}

func (c *serveCmd) printBanner(url string) {
	first := strings.Split(url, ",")[0]
	p := c.Prefix
	fmt.Printf(`jetlock is serving.
  NATS URLs: %s
`, url)
	if !c.Dev {
		return
	}
	fmt.Printf(`Callers connect without credentials; the operator is user %q, password %q (loopback only).
Try it with the nats CLI (go install github.com/nats-io/natscli/nats@v0.5.0):
  nats -s %s req %s.v1.acquire '{"resource":"orders/1","request_id":"r1","owner":"me","ttl_ms":30000}'
  nats -s %s req %s.v1.status  '{"resource":"orders/1"}'
  nats -s %s --user operator --password operator kv get %s lease.orders/1
  nats -s %s --user operator --password operator micro stats jetlock
Ctrl-C stops the service and the cluster (data stays in %s).
`, "operator", devcluster.OperatorPassword, first, p, first, p, first, c.Bucket, first, c.DevDir)
}
