package deploytest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/internal/testca"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

// cluster is deploy/'s three servers running in this process from their
// configuration files, on loopback ports, with a throw-away CA.
type cluster struct {
	t       *testing.T
	keys    keys
	ca      *testca.CA
	certs   map[string]testca.Pair // client certificates by role
	servers []*server.Server
	// logs, when set, receive each server's log with debug lines (its
	// raft groups' too), by server name.
	logs map[string]*serverLog
}

// startCluster renders deploy/nats for three servers on free loopback
// ports (routes to "localhost", which the throw-away server certificate
// names, so the route host check of the configuration holds), starts them
// and waits for a JetStream meta leader that sees all three.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	return startClusterWith(t, setIdentities(t))
}

// startClusterWith is startCluster with the users' keys ks, whose public
// keys the environment already holds.
func startClusterWith(t *testing.T, ks keys) *cluster {
	t.Helper()
	return startClusterOf(t, &cluster{t: t, keys: ks, certs: map[string]testca.Pair{}})
}

// startClusterLogged is startCluster with every server's log, debug lines
// included, kept in c.logs.
func startClusterLogged(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{t: t, keys: setIdentities(t), certs: map[string]testca.Pair{}, logs: map[string]*serverLog{}}
	for _, s := range servers {
		c.logs[s.name] = &serverLog{}
	}
	return startClusterOf(t, c)
}

func startClusterOf(t *testing.T, c *cluster) *cluster {
	t.Helper()
	dir := t.TempDir()
	ca, err := testca.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	c.ca = ca
	if _, err := ca.Server("server"); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"lockd", "orders", "billing", "operator", "inspector"} {
		p, err := ca.Client(role)
		if err != nil {
			t.Fatal(err)
		}
		c.certs[role] = p
	}
	const attempts = 3 // a free port can be taken before a server binds it
	for attempt := 1; ; attempt++ {
		err := c.start(dir, attempt)
		if err == nil {
			break
		}
		c.shutdown()
		if attempt == attempts {
			t.Fatal(err)
		}
		t.Logf("cluster start %d: %v; again on other ports", attempt, err)
	}
	t.Cleanup(c.shutdown)
	return c
}

func (c *cluster) start(dir string, attempt int) error {
	ports := make([]int, len(servers))
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	c.servers = nil
	for i, s := range servers {
		d := filepath.Join(dir, fmt.Sprintf("%s-%d", s.name, attempt))
		subst := [][2]string{
			{tlsDir, dir + "/"},
			{storeDir, filepath.Join(d, "data")},
			{`listen: "0.0.0.0:4222"`, `listen: "127.0.0.1:-1"`},
			{`http: "0.0.0.0:8222"`, `http: "127.0.0.1:-1"`},
			{`listen: "0.0.0.0:6222"`, fmt.Sprintf(`listen: "127.0.0.1:%d"`, ports[i])},
		}
		for j, peer := range servers {
			subst = append(subst, [2]string{"nats-route://" + peer.name + ":6222", fmt.Sprintf("nats-route://localhost:%d", ports[j])})
		}
		render(c.t, d, subst)
		o := parse(c.t, filepath.Join(d, s.name+".conf"))
		o.NoSigs, o.NoLog = true, true
		srv, err := server.NewServer(o)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if l := c.logs[s.name]; l != nil {
			// Before Start: a raft group logs debug lines only if the
			// server did when the group was created.
			srv.SetLoggerV2(l, true, false, false)
		}
		srv.Start()
		c.servers = append(c.servers, srv)
		if !srv.ReadyForConnections(10 * time.Second) {
			return fmt.Errorf("%s not ready for connections", s.name)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		current, leader := true, false
		for _, s := range c.servers {
			current = current && s.JetStreamIsCurrent()
			if s.JetStreamIsLeader() {
				leader = len(s.JetStreamClusterPeers()) == len(c.servers)
			}
		}
		if current && leader {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("JetStream not ready in 30s")
}

func (c *cluster) shutdown() {
	for _, s := range c.servers {
		s.Shutdown()
		s.WaitForShutdown()
	}
	c.servers = nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// url returns the client URLs of every server.
func (c *cluster) urls() string {
	var out []string
	for _, s := range c.servers {
		out = append(out, s.ClientURL())
	}
	return strings.Join(out, ",")
}

// conn is a connection as one role, which records the asynchronous errors
// the server reports to it (permission violations).
type conn struct {
	*nats.Conn
	role string

	mu   sync.Mutex
	errs []error
}

// inboxes are the inbox prefixes of each role: the service's users have
// theirs, each caller its own (accounts.conf).
var inboxes = map[string]string{
	"service":   streams.ServiceInboxPrefix,
	"store":     streams.StoreInboxPrefix,
	"orders":    "_INBOX_orders",
	"billing":   "_INBOX_billing",
	"operator":  "_INBOX",
	"inspector": "_INBOX",
}

// certOf is the client certificate each role presents.
var certOf = map[string]string{"service": "lockd", "store": "lockd", "orders": "orders", "billing": "billing", "operator": "operator", "inspector": "inspector"}

// connect connects as role to url (every server when empty), the way
// lockd's connection flags do: the CA, a client certificate, the role's
// nkey and inbox prefix.
func (c *cluster) connect(role, url string) *conn {
	c.t.Helper()
	if url == "" {
		url = c.urls()
	}
	kp := c.keys[role]
	pub := c.keys.public(c.t, role)
	cc := &conn{role: role}
	cert := c.certs[certOf[role]]
	nc, err := nats.Connect(url,
		nats.Name("deploytest-"+role),
		nats.RootCAs(c.ca.CertFile),
		nats.ClientCert(cert.CertFile, cert.KeyFile),
		nats.Nkey(pub, kp.Sign),
		nats.CustomInboxPrefix(inboxes[role]),
		nats.MaxReconnects(-1),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			cc.mu.Lock()
			cc.errs = append(cc.errs, err)
			cc.mu.Unlock()
		}))
	if err != nil {
		c.t.Fatalf("connect as %s: %v", role, err)
	}
	cc.Conn = nc
	c.t.Cleanup(nc.Close)
	return cc
}

// violation waits (at most 5s) for the server to report a permission
// violation on subject to the connection, and fails the test without one.
// what says what was tried.
func (cc *conn) violation(t *testing.T, what, kind, subject string) {
	t.Helper()
	want := fmt.Sprintf("%s to %q", kind, subject)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_ = cc.FlushTimeout(time.Second)
		cc.mu.Lock()
		for _, err := range cc.errs {
			if strings.Contains(err.Error(), want) {
				cc.mu.Unlock()
				if !errorsIsPermission(err) {
					t.Errorf("%s as %s: %v is not nats.ErrPermissionViolation", what, cc.role, err)
				}
				return
			}
		}
		seen := fmt.Sprint(cc.errs)
		cc.mu.Unlock()
		if time.Now().After(deadline) {
			t.Errorf("%s as %s: no permission violation %q in 5s (errors: %s)", what, cc.role, want, seen)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// noViolations fails the test if the server reported any permission
// violation to the connection.
func (cc *conn) noViolations(t *testing.T) {
	t.Helper()
	_ = cc.FlushTimeout(time.Second)
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for _, err := range cc.errs {
		t.Errorf("%s: %v", cc.role, err)
	}
}

// running is the service, started on deploy/'s two service users.
type running struct {
	svc      *service.Service
	reg      *prometheus.Registry
	requests *conn
	store    *conn
	cancel   context.CancelFunc
	done     chan error
}

// serve starts the jetlock service as lockd does, on a request connection
// and a store connection as the deploy users service and store, and waits
// until callers reach it through every server.
func (c *cluster) serve() *running {
	c.t.Helper()
	cfg := service.DefaultConfig()
	cfg.ExpiryGrace = 500 * time.Millisecond
	cfg.SweepInterval = 50 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	r := &running{reg: prometheus.NewRegistry(), requests: c.connect("service", ""), store: c.connect("store", ""), done: make(chan error, 1)}
	cfg.Registerer = r.reg
	svc, err := service.New(r.requests.Conn, r.store.Conn, cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	r.svc = svc
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- svc.Run(ctx) }()
	c.t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(20 * time.Second):
			c.t.Error("service did not stop in 20s")
		}
	})
	select {
	case <-svc.Ready():
	case err := <-r.done:
		c.t.Fatalf("the service did not start as deploy/'s users: %v", err)
	case <-time.After(60 * time.Second):
		c.t.Fatal("service not ready in 60s")
	}
	for _, s := range c.servers {
		nc := c.connect("orders", s.ClientURL())
		testenv.Eventually(c.t, 30*time.Second, func() bool {
			_, err := nc.Request(streams.Subject(streams.DefaultPrefix, streams.OpStatus), []byte(`{"resource":"ping"}`), time.Second)
			return err == nil
		}, "service unreachable through %s", s.Name())
		nc.Close()
	}
	return r
}
