// Command lockd runs the jetlock lock service.
//
//	lockd --dev                  # embedded three-node dev cluster + service
//	lockd --url nats://host:4222 # serve against an existing cluster
//
// Every flag can also be set through the environment variable named in
// --help.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
	"github.com/jetlock/jetlock/streams/devcluster"
)

type cli struct {
	Dev      bool   `help:"Start an embedded three-node cluster (loopback, sync always, zones az:a/b/c) and serve on it." env:"JETLOCK_DEV"`
	DevDir   string `help:"Data directory of the dev cluster; kept across runs so tokens keep rising." default:".jetlock" env:"JETLOCK_DEV_DIR"`
	DevPorts []int  `help:"Client ports of the three dev nodes." default:"4222,4223,4224" env:"JETLOCK_DEV_PORTS"`

	URL      string `help:"NATS server URL(s), comma separated (ignored with --dev)." default:"nats://127.0.0.1:4222" env:"NATS_URL"`
	Creds    string `help:"NATS credentials file." env:"NATS_CREDS" type:"existingfile"`
	NKey     string `help:"NATS NKey seed file." name:"nkey" env:"NATS_NKEY" type:"existingfile"`
	User     string `help:"NATS user name." env:"NATS_USER"`
	Password string `help:"NATS password." env:"NATS_PASSWORD"`
	TLSCert  string `help:"TLS client certificate." name:"tls-cert" env:"NATS_CERT" type:"existingfile"`
	TLSKey   string `help:"TLS client key." name:"tls-key" env:"NATS_KEY" type:"existingfile"`
	TLSCA    string `help:"TLS CA certificate." name:"tls-ca" env:"NATS_CA" type:"existingfile"`

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

func main() {
	var c cli
	kong.Parse(&c, kong.Name("lockd"), kong.Description("jetlock: exclusive leases with fencing tokens over NATS."))
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "lockd:", err)
		os.Exit(1)
	}
}

func run(c cli) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	url := c.URL
	var opts []nats.Option
	if c.Dev {
		if len(c.DevPorts) != devcluster.Size {
			return fmt.Errorf("--dev-ports needs %d ports", devcluster.Size)
		}
		cl, err := devcluster.Start(devcluster.Options{Dir: c.DevDir, ClientPorts: c.DevPorts})
		if err != nil {
			return err
		}
		defer cl.Shutdown()
		url = cl.URLs()
	} else {
		if c.Creds != "" {
			opts = append(opts, nats.UserCredentials(c.Creds))
		}
		if c.NKey != "" {
			o, err := nats.NkeyOptionFromSeed(c.NKey)
			if err != nil {
				return err
			}
			opts = append(opts, o)
		}
		if c.User != "" {
			opts = append(opts, nats.UserInfo(c.User, c.Password))
		}
		if c.TLSCert != "" || c.TLSKey != "" {
			opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
		}
		if c.TLSCA != "" {
			opts = append(opts, nats.RootCAs(c.TLSCA))
		}
	}
	opts = append(opts, nats.Name("jetlock-lockd"), nats.MaxReconnects(-1))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return fmt.Errorf("connect %s: %w", url, err)
	}
	defer nc.Close()

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
			if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
				log.Error("metrics server", "err", err)
			}
		}()
		defer srv.Close()
	}
	svc, err := service.New(nc, cfg)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
		printBanner(url, c)
	case err := <-done:
		return err
	}
	return <-done
}

func printBanner(url string, c cli) {
	first := strings.Split(url, ",")[0]
	p := c.Prefix
	fmt.Printf(`jetlock is serving.
  NATS URLs: %s
Try it with the nats CLI (go install github.com/nats-io/natscli/nats@v0.5.0):
  nats -s %s req %s.v1.acquire '{"resource":"orders/1","request_id":"r1","owner":"me","ttl_ms":30000}'
  nats -s %s req %s.v1.status  '{"resource":"orders/1"}'
  nats -s %s kv get %s lease.orders/1
  nats -s %s micro stats jetlock
Ctrl-C stops the service and the cluster (data stays in %s).
`, url, first, p, first, p, first, c.Bucket, first, c.DevDir)
}
