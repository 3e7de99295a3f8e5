package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/gctune"
	"github.com/jetlock/jetlock/internal/version"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

// bucketFlags define the lock bucket; serve and check share them (and
// their environment variables), so check compares against the definition
// serve ensures.
type bucketFlags struct {
	Bucket      string        `help:"KV bucket holding lock state." default:"jetlock" env:"JETLOCK_BUCKET"`
	Replicas    int           `help:"Bucket replicas (3 = one per zone; fewer needs --allow-single-replica)." default:"3" env:"JETLOCK_REPLICAS"`
	AllowR1     bool          `help:"Allow fewer than 3 replicas (loses acknowledged state when a server dies)." name:"allow-single-replica" env:"JETLOCK_ALLOW_SINGLE_REPLICA"`
	RetryWindow time.Duration `help:"How long an acquire retried with the same request_id is recognised (the stream's duplicate window)." default:"2m" env:"JETLOCK_RETRY_WINDOW"`
}

func (b bucketFlags) config() streams.BucketConfig {
	return streams.BucketConfig{Bucket: b.Bucket, Replicas: b.Replicas, AllowSingleReplica: b.AllowR1, RetryWindow: b.RetryWindow}
}

// devFlags locate lockd's dev cluster.
type devFlags struct {
	DevDir string `help:"Data directory of the dev cluster; kept across runs so tokens keep rising." default:".jetlock" env:"JETLOCK_DEV_DIR"`
}

// devStoreFile, in the dev directory, holds the URLs and the store user of
// a running lockd --dev (mode 0600, removed when it stops), so that
// lockd check --dev can reach the bucket with the rights --fix needs. The
// dev cluster gives its service users new random passwords at every start.
const devStoreFile = "lockd-dev-store.json"

type devStore struct {
	URLs     string `json:"urls"`
	User     string `json:"user"`
	Password string `json:"password"`
}

type serveCmd struct {
	Dev      bool  `help:"Start an embedded three-node cluster (loopback, sync always, zones az:a/b/c, the users of deploy/) and serve on it." env:"JETLOCK_DEV"`
	DevPorts []int `help:"Client ports of the three dev nodes." default:"4222,4223,4224" env:"JETLOCK_DEV_PORTS"`
	devFlags `embed:""`

	connFlags `embed:""`

	Prefix      string `help:"Subject prefix." default:"jetlock" env:"JETLOCK_PREFIX"`
	bucketFlags `embed:""`
	DefaultTTL  time.Duration `help:"TTL of a lease whose request names none." default:"30s" name:"default-ttl" env:"JETLOCK_DEFAULT_TTL"`
	MinTTL      time.Duration `help:"Smallest ttl_ms accepted." default:"1s" name:"min-ttl" env:"JETLOCK_MIN_TTL"`
	MaxTTL      time.Duration `help:"Largest ttl_ms accepted." default:"10m" name:"max-ttl" env:"JETLOCK_MAX_TTL"`
	MaxHold     time.Duration `help:"Longest a lease may be held in total, renewals included: the cap on max_hold_ms, also applied when a request names none; 0 = no cap." default:"24h" env:"JETLOCK_MAX_HOLD"`
	MaxWait     time.Duration `help:"Largest wait_ms accepted." default:"5m" env:"JETLOCK_MAX_WAIT"`
	ExpiryGrace time.Duration `help:"Added to a lease's TTL before the service expires it." default:"2s" env:"JETLOCK_EXPIRY_GRACE"`

	OwnerRate float64 `help:"Fair use: acquires a second per owner (burst twice that); over it, acquire is answered unavailable with retry_after_ms; 0 = no limit." default:"0" env:"JETLOCK_OWNER_RATE"`
	UserRate  float64 `help:"Fair use: operations a second per tenant (a NATS user as the server vouches for it on an import), weighted by cost (acquire 1, waiting acquire 2, cancel 2, renewing or releasing an unknown lease 2, list 1 plus 1 per 10 leases asked for, others 1; renewing or releasing a current lease 0), burst twice that; over it, unavailable with retry_after_ms; 0 = no limit." default:"0" env:"JETLOCK_USER_RATE"`

	TenantRates           map[string]float64 `help:"Fair use: a tenant's own rate instead of --user-rate, as ACCOUNT/user=RATE or ACCOUNT=RATE (every user of the account; the user's entry wins), separated by ';'; 0 = no limit for it." placeholder:"TENANT=RATE;..." mapsep:";" env:"JETLOCK_TENANT_RATES"`
	Operators             []string           `help:"Who may revoke: ACCOUNT (every user of it) or ACCOUNT/user, as the NATS server stamps it on the operators' import; an admin request without such a stamp is forbidden." default:"OPERATORS" env:"JETLOCK_OPERATORS"`
	MaxWaitersPerResource int                `help:"Waiting acquires one resource may queue; more are answered too_many_waiters." default:"1000" env:"JETLOCK_MAX_WAITERS_PER_RESOURCE"`
	MaxWaitersPerTenant   int                `help:"Waiting acquires one tenant (NATS user) may have queued across all resources; more are answered too_many_waiters." default:"1000" env:"JETLOCK_MAX_WAITERS_PER_TENANT"`
	MaxLeasesPerTenant    int                `help:"Leases one tenant (NATS user) may hold at once, as this instance knows them; more are answered too_many_waiters; 0 = no cap." default:"0" env:"JETLOCK_MAX_LEASES_PER_TENANT"`
	MaxPerSession         int                `help:"Leases and waits one session may hold together; more are answered too_many_waiters." default:"10000" env:"JETLOCK_MAX_PER_SESSION"`
	MaxSessionsPerTenant  int                `help:"Sessions one tenant (NATS user) may keep open, as this instance knows them; more are answered too_many_waiters." default:"10000" env:"JETLOCK_MAX_SESSIONS_PER_TENANT"`
	MaxSetSize            int                `help:"Resources one lock set may name (2 to 256); more are answered invalid_request." default:"64" env:"JETLOCK_MAX_SET_SIZE"`
	MaxBody               int                `help:"Largest request body in bytes; a larger one is answered invalid_request before it is decoded. 0: the largest valid request (about 21 KiB with sets of 64)." default:"0" env:"JETLOCK_MAX_BODY"`

	MaxInFlight int           `help:"Requests processed at once." default:"4096" env:"JETLOCK_MAX_IN_FLIGHT"`
	MaxQueued   int           `help:"Requests waiting for a place beyond --max-in-flight; more are answered unavailable." default:"16384" env:"JETLOCK_MAX_QUEUED"`
	MaxPerKey   int           `help:"Requests of this instance that may wait behind others on the same resource; more are answered unavailable." default:"64" env:"JETLOCK_MAX_PER_KEY"`
	QueueWait   time.Duration `help:"How long a request may wait for a place before it is answered unavailable." default:"1s" env:"JETLOCK_QUEUE_WAIT"`
	OpTimeout   time.Duration `help:"Bound on the store work of one request: it ends within --queue-wait plus this of the request's receipt; keep that sum below the clients' request timeout." default:"3s" env:"JETLOCK_OP_TIMEOUT"`

	Metrics  string `help:"Serve /metrics (Prometheus), /healthz and /readyz on this address (e.g. 127.0.0.1:9090; port 0 picks one, shown in the banner); empty disables." env:"JETLOCK_METRICS"`
	PProf    bool   `name:"pprof" help:"Also serve the Go runtime's profiles under /debug/pprof/ on the --metrics address (like etcd's --enable-pprof); keep that address private." env:"JETLOCK_PPROF"`
	Audit    string `help:"Audit log (JSON lines: grants, renew refusals, releases, expiries, hand-overs, cancels, revokes; never a lease id): a file path (appended, mode 0600), stderr or stdout; empty disables." env:"JETLOCK_AUDIT"`
	LogLevel string `help:"Log level: debug, info, warn, error." default:"info" enum:"debug,info,warn,error" env:"JETLOCK_LOG_LEVEL"`

	// app is the dev cluster's application user (--dev): a caller with
	// JetStream in an account of its own, printed in the banner.
	app struct{ user, password string }
}

// config returns the service configuration of the flags, validated: a bad
// value is a usage error, found before anything starts.
func (c *serveCmd) config() (service.Config, error) {
	cfg := service.DefaultConfig()
	cfg.Prefix = c.Prefix
	cfg.Bucket = c.bucketFlags.config()
	cfg.DefaultTTL, cfg.MinTTL, cfg.MaxTTL, cfg.MaxWait = c.DefaultTTL, c.MinTTL, c.MaxTTL, c.MaxWait
	cfg.MaxHold, cfg.ExpiryGrace = c.MaxHold, c.ExpiryGrace
	cfg.OwnerRate, cfg.UserRate = c.OwnerRate, c.UserRate
	cfg.Operators, cfg.MaxBodyBytes, cfg.TenantRates = c.Operators, c.MaxBody, c.TenantRates
	cfg.MaxWaitersPerResource, cfg.MaxWaitersPerTenant, cfg.MaxLeasesPerTenant = c.MaxWaitersPerResource, c.MaxWaitersPerTenant, c.MaxLeasesPerTenant
	cfg.MaxPerSession, cfg.MaxSessionsPerTenant, cfg.MaxSetSize = c.MaxPerSession, c.MaxSessionsPerTenant, c.MaxSetSize
	cfg.MaxInFlight, cfg.MaxQueued, cfg.MaxPerKey = c.MaxInFlight, c.MaxQueued, c.MaxPerKey
	cfg.QueueWait, cfg.OpTimeout = c.QueueWait, c.OpTimeout
	if v := version.Get().SemVer(); v != "" {
		cfg.Version = v // nats micro info jetlock; a build without one keeps the service's default
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError("%v", err)
	}
	if c.PProf && c.Metrics == "" {
		return cfg, usageError("--pprof serves on the --metrics address: set --metrics too")
	}
	if c.Dev && len(c.DevPorts) != devcluster.Size {
		return cfg, usageError("--dev-ports needs %d ports", devcluster.Size)
	}
	return cfg, nil
}

// openAudit opens the audit sink: nil for none.
func openAudit(dest string, std *stdio) (*slog.Logger, func(), error) {
	var w io.Writer
	closer := func() {}
	switch dest {
	case "":
		return nil, closer, nil
	case "stderr":
		w = std.err
	case "stdout":
		w = std.out
	default:
		f, err := os.OpenFile(dest, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("audit log: %w", err)
		}
		w, closer = f, func() { _ = f.Close() }
	}
	return slog.New(slog.NewJSONHandler(w, nil)), closer, nil
}

func (c *serveCmd) Run(ctx context.Context, out *stdio) error {
	cfg, err := c.config()
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return usageError("%v", err)
	}
	log := slog.New(slog.NewTextHandler(out.err, &slog.HandlerOptions{Level: level}))
	cfg.Logger = log
	if gctune.Apply(os.LookupEnv) {
		log.Debug("garbage collector target set (GOGC is not set)", "gogc", gctune.Percent)
	}
	audit, closeAudit, err := openAudit(c.Audit, out)
	if err != nil {
		return err
	}
	defer closeAudit()
	cfg.Audit = audit

	// Take the metrics address before anything starts, so that a bad or
	// busy one stops lockd at once.
	var ln net.Listener
	var reg *prometheus.Registry
	if c.Metrics != "" {
		if ln, err = net.Listen("tcp", c.Metrics); err != nil {
			return fmt.Errorf("--metrics: %w", err)
		}
		defer ln.Close()
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		cfg.Registerer = reg
	}

	nc, storeNC, url, cleanup, err := c.connect(log)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := preflight(ctx, storeNC, &cfg.Bucket, log); err != nil {
		return err
	}
	if !c.Dev && c.sameUser() {
		log.Warn("the request and store connections use the same credentials: replies are then published with rights on the bucket; give the request connection a user without $JS/$KV rights (see deploy/)")
	}
	svc, err := service.New(nc, storeNC, cfg)
	if err != nil {
		return err
	}
	metricsURL := ""
	if ln != nil {
		srv := &http.Server{Handler: newHTTPHandler(reg, svc, c.PProf), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server", "err", err)
			}
		}()
		defer srv.Close()
		metricsURL = "http://" + ln.Addr().String()
		log.Info("serving /metrics, /healthz and /readyz", "url", metricsURL)
	}
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
		c.printBanner(out.out, url, metricsURL)
	case err := <-done:
		return err
	}
	return <-done
}

// connect starts the dev cluster (with --dev) and opens the service's two
// connections. cleanup closes them and stops the cluster.
func (c *serveCmd) connect(log *slog.Logger) (nc, storeNC *nats.Conn, url string, cleanup func(), err error) {
	if c.Dev {
		cl, err := c.startDev(log)
		if err != nil {
			return nil, nil, "", nil, err
		}
		nc, storeNC, err := cl.ConnectService(asyncErrors(log))
		if err != nil {
			cl.Shutdown()
			return nil, nil, "", nil, err
		}
		user, password := cl.User(devcluster.Store)
		c.app.user, c.app.password = cl.User(devcluster.App)
		removeStore, err := writeDevStore(c.DevDir, devStore{URLs: cl.URLs(), User: user, Password: password})
		if err != nil {
			nc.Close()
			storeNC.Close()
			cl.Shutdown()
			return nil, nil, "", nil, err
		}
		return nc, storeNC, cl.URLs(), func() { removeStore(); nc.Close(); storeNC.Close(); cl.Shutdown() }, nil
	}
	reqOpts, err := c.options(c.Requests, "jetlock-lockd", streams.ServiceInboxPrefix)
	if err != nil {
		return nil, nil, "", nil, usageError("%v", err)
	}
	storeOpts, err := c.options(c.Store, "jetlock-lockd-store", streams.StoreInboxPrefix)
	if err != nil {
		return nil, nil, "", nil, usageError("%v", err)
	}
	reqOpts, storeOpts = append(reqOpts, asyncErrors(log)), append(storeOpts, asyncErrors(log))
	if nc, err = nats.Connect(c.Server, reqOpts...); err != nil {
		return nil, nil, "", nil, connectError(c.Server, "request", err)
	}
	if storeNC, err = nats.Connect(c.Server, storeOpts...); err != nil {
		nc.Close()
		return nil, nil, "", nil, connectError(c.Server, "store", err)
	}
	return nc, storeNC, c.Server, func() { nc.Close(); storeNC.Close() }, nil
}

// asyncErrors logs the errors the NATS server reports asynchronously on a
// connection of lockd's (a refused publish or subscription), in lockd's
// log rather than as nats.go's own line on stderr. The service watches
// the connections' last errors itself and reports a permission error as
// not ready (see service.Health).
func asyncErrors(log *slog.Logger) nats.Option {
	return nats.ErrorHandler(func(nc *nats.Conn, _ *nats.Subscription, err error) {
		log.Warn("NATS server error", "connection", nc.Opts.Name, "err", err)
	})
}

// startDev starts the dev cluster. On the data of an earlier run it says
// why that takes seconds: every NATS node recovers its streams, and each
// replicated group (the JetStream meta group, then every stream) elects a
// leader only after its raft election timeout, which nats-server draws
// between 4 and 9 s and does not let be configured.
func (c *serveCmd) startDev(log *slog.Logger) (*devcluster.Cluster, error) {
	if err := devcluster.CheckPorts(c.DevPorts); errors.Is(err, devcluster.ErrPortInUse) {
		return nil, usageError("--dev: %v: another lockd --dev, or another NATS server, is running; stop it, or choose free ports with --dev-ports", err)
	}
	start := time.Now()
	restart := false
	if entries, err := os.ReadDir(c.DevDir); err == nil && len(entries) > 0 {
		restart = true
		log.Info("starting the dev cluster on the data of an earlier run: its NATS nodes elect leaders again after nats-server's raft election timeout (4 to 9 s), for the JetStream meta group and for each stream", "dir", c.DevDir)
	}
	cl, err := devcluster.Start(devcluster.Options{Dir: c.DevDir, ClientPorts: c.DevPorts, Prefix: c.Prefix})
	if err != nil {
		return nil, err
	}
	if restart {
		log.Info("dev cluster ready", "took", time.Since(start).Round(time.Millisecond))
	}
	return cl, nil
}

// writeDevStore writes the dev store file (see devStoreFile) and returns
// the function that removes it.
func writeDevStore(dir string, s devStore) (func(), error) {
	path := filepath.Join(dir, devStoreFile)
	_ = os.Remove(path) // a stale one, of a lockd --dev that was killed
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("dev store file: %w", err)
	}
	err = json.NewEncoder(f).Encode(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("dev store file: %w", err)
	}
	return func() { _ = os.Remove(path) }, nil
}

func (c *serveCmd) printBanner(w io.Writer, url, metricsURL string) {
	first := strings.Split(url, ",")[0]
	p := c.Prefix
	fmt.Fprintf(w, `jetlock is serving.
  NATS URLs: %s
`, url)
	if metricsURL != "" {
		fmt.Fprintf(w, "  Metrics: %s/metrics  Health: %s/healthz  Ready: %s/readyz\n", metricsURL, metricsURL, metricsURL)
	}
	if !c.Dev {
		return
	}
	fmt.Fprintf(w, `Callers connect without credentials; the operator (admin requests such as revoke) is user %q, password %q;
read-only inspection of the bucket and the service is user %q, password %q (loopback only).
Try it with the nats CLI (go install github.com/nats-io/natscli/nats@v0.5.0):
  nats -s %s req %s.v1.acquire '{"resource":"orders/1","request_id":"r1","owner":"me","ttl_ms":30000}'
  nats -s %s req %s.v1.status  '{"resource":"orders/1"}'
  nats -s %s --user %s --password %s kv get %s lease.orders/1
  nats -s %s --user %s --password %s micro stats jetlock
Check the bucket's configuration: lockd check --dev --dev-dir %s
Ctrl-C stops the service and the cluster (data stays in %s).
`, "operator", devcluster.OperatorPassword, "inspector", devcluster.InspectorPassword,
		first, p, first, p,
		first, "inspector", devcluster.InspectorPassword, c.Bucket,
		first, "inspector", devcluster.InspectorPassword,
		c.DevDir, c.DevDir)
	// Callers, the operator and the inspector have no JetStream of their
	// own; the application user has, in its own account, for protected
	// resources that live in NATS (client/fence.NewKV) beside its lock
	// requests.
	fmt.Fprintf(w, `An application with JetStream in an account of its own (for client/fence.NewKV; it calls the service like a caller):
  user %q, password %q (new at every start; loopback only)
  nats -s %s --user %s --password %s kv add fences
`, c.app.user, c.app.password, first, c.app.user, c.app.password)
}
