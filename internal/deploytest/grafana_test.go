package deploytest

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/service"
)

// describer records the metric names of every collector registered on it.
type describer struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d.names[m[1]] = true
		}
	}
	return nil
}
func (d *describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}
func (d *describer) Unregister(prometheus.Collector) bool { return false }

// serviceMetrics returns the names of the metrics a service registers
// (service.Config.Registerer), from a service built on two connections to
// a throw-away server; it is never run.
func serviceMetrics(t *testing.T) map[string]bool {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	var conns [2]*nats.Conn
	for i := range conns {
		nc, err := nats.Connect(s.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		conns[i] = nc
	}
	d := &describer{names: map[string]bool{}}
	cfg := service.DefaultConfig()
	cfg.Registerer = d
	if _, err := service.New(conns[0], conns[1], cfg); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"jetlock_requests_total", "jetlock_request_duration_seconds", "jetlock_handovers_total", "jetlock_leases_active"} {
		if !d.names[n] {
			t.Fatalf("%s not among the registered metrics %v", n, d.names)
		}
	}
	return d.names
}

// The dashboard is valid JSON, and every metric it queries is one the
// service registers (a histogram by its _bucket, _sum and _count series).
func TestGrafanaDashboard(t *testing.T) {
	var dash map[string]any
	if err := json.Unmarshal([]byte(readDeploy(t, "grafana/jetlock.json")), &dash); err != nil {
		t.Fatal(err)
	}
	if dash["title"] == nil || dash["panels"] == nil {
		t.Fatal("no title or panels")
	}
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	if len(exprs) == 0 {
		t.Fatal("no queries")
	}
	registered := serviceMetrics(t)
	used := map[string]bool{}
	name := regexp.MustCompile(`\bjetlock_[a-z_]+`)
	for _, e := range exprs {
		for _, m := range name.FindAllString(e, -1) {
			base := m
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(m, suffix); ok && registered[b] {
					base = b
				}
			}
			if !registered[base] {
				t.Errorf("the dashboard queries %s, which the service does not register (query %s)", m, e)
			}
			used[base] = true
		}
	}
	var unshown []string
	for n := range registered {
		if !used[n] {
			unshown = append(unshown, n)
		}
	}
	slices.Sort(unshown)
	if len(unshown) > 0 {
		t.Logf("metrics without a panel: %v", unshown)
	}
}
