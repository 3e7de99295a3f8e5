package main

import (
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/service"
)

// TestMain lets the test binary serve as a cluster node and as the service
// process, as the bench binary does (both re-execute the running binary).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case devcluster.NodeCommand:
			os.Exit(devcluster.NodeMain())
		case cmdService:
			os.Exit(serviceMain(os.Args[2:]))
		}
	}
	os.Exit(m.Run())
}

func TestParseFlagsDefaultsAreTheDesignWorkload(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.scenario != "steady" || c.resources != 100_000 || c.leases != 20_000 || c.acquireRate != 2000 ||
		c.releaseRate != 2000 || c.renewRate != 2000 || c.serviceMode != "proc" || !c.auth || c.instances != 1 ||
		c.clients != "any" || c.workers != 64 {
		t.Fatalf("defaults %+v", c)
	}
	c, err = parseFlags([]string{"--url", "nats://127.0.0.1:4222"})
	if err != nil || c.serviceMode != "none" {
		t.Fatalf("--url: service %q err %v", c.serviceMode, err)
	}
	c, err = parseFlags([]string{"--lockd", "/bin/lockd", "--auth=false"})
	if err != nil || c.serviceMode != "proc" || c.auth || c.settings()["lockd"] != "/bin/lockd" {
		t.Fatalf("--lockd: %+v err %v", c, err)
	}
}

func TestParseFlagsRefusesWhatCannotWork(t *testing.T) {
	for _, args := range [][]string{
		{"--scenario", "nope"},
		{"--leases", "10", "--resources", "5"},
		{"--scenario", "failover", "--url", "nats://127.0.0.1:4222"},
		{"--scenario", "degraded", "--url", "nats://127.0.0.1:4222"},
		{"--scenario", "rolling", "--url", "nats://127.0.0.1:4222"},
		{"--scenario", "failover", "--failover-mode", "stop", "--url", "nats://127.0.0.1:4222"},
		{"--scenario", "rolling", "--failover-mode", "stepdown"},
		{"--scenario", "rolling", "--restart", "everything"},
		{"--scenario", "rolling", "--restart", "services"}, // one instance leaves nobody to answer
		{"--scenario", "rolling", "--settle", "-1s"},
		{"--failover-mode", "pause"},
		{"--service", "none"},
		{"--target", "etcd"},
		{"--instances", "0"},
		{"--instances", "2", "--url", "nats://127.0.0.1:4222"}, // a deployed service's instances are its own
		{"--instances", "-1", "--service", "inproc"},
		{"--url", "nats://127.0.0.1:4222", "--service-queue-wait", "2s"},
		{"--url", "nats://127.0.0.1:4222", "--auth=false"},
		{"--lockd", "/bin/lockd", "--service", "inproc"},
		{"--service-max-in-flight", "0"},
		{"--service-queue-wait", "-1s"},
		{"--clients", "nearby"},
		{"--clients", "service"},
		{"--leader", "away"},
		{"--leader", "service", "--service", "inproc", "--url", "nats://127.0.0.1:4222", "--service", "none"},
		{"--workers", "0"},
		{"--poll", "20ms"}, // the polling fallback is gone
		{"--scenario", "cycles", "--target", "raw", "--raw-batch", "0"},
		{"--scenario", "cycles", "--target", "raw", "--raw-batch", "1001"},
		{"--scenario", "cycles", "--raw-batch", "8"},                    // batches are bare KV writes
		{"--scenario", "steady", "--target", "raw", "--raw-batch", "8"}, // and only in cycles
		{"--scenario", "cycles", "--target", "raw", "--raw-batch", "8", "--resources", "1000", "--workers", "100"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	// Without batches, a worker's share may be small. Several instances
	// run as processes of their own (the bench's service or a lockd), or
	// in this process.
	for _, args := range [][]string{
		{"--instances", "2"},
		{"--instances", "3", "--lockd", "/bin/lockd"},
		{"--instances", "2", "--service", "inproc"},
		{"--scenario", "cycles", "--target", "raw", "--raw-batch", "8", "--workers", "32"},
		{"--scenario", "cycles", "--resources", "100", "--leases", "0", "--workers", "64"},
		{"--scenario", "failover", "--failover-mode", "stepdown", "--url", "nats://127.0.0.1:4222"},
		{"--scenario", "failover", "--failover-mode", "stop"},
		{"--scenario", "failover", "--failover-mode", "term"},
		{"--scenario", "rolling", "--restart", "nodes"},
		{"--scenario", "rolling", "--restart", "services", "--instances", "2"},
		{"--scenario", "rolling", "--settle", "60s", "--duration", "10m"},
	} {
		if _, err := parseFlags(args); err != nil {
			t.Errorf("%v refused: %v", args, err)
		}
	}
	// rolling stops nodes in lame duck mode, for long enough to restart
	// all of them, unless told otherwise.
	c, err := parseFlags([]string{"--scenario", "rolling"})
	if err != nil || c.failoverMode != "stop" || c.duration != rollingDuration || c.killAt != rollingStartAt {
		t.Fatalf("rolling defaults: %+v, %v", c, err)
	}
	c, err = parseFlags([]string{"--scenario", "rolling", "--failover-mode", "kill", "--duration", "30s"})
	if err != nil || c.failoverMode != "kill" || c.duration != 30*time.Second || c.killAt != 10*time.Second {
		t.Fatalf("rolling with flags: %+v, %v", c, err)
	}
}

// The service's overload settings default to the service's own, and reach
// a service process through its flags (lockd's) unchanged.
func TestServiceTuningFlags(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, d := c.tune.config(service.Config{}), service.DefaultConfig()
	if cfg.MaxInFlight != d.MaxInFlight || cfg.MaxQueued != d.MaxQueued || cfg.QueueWait != d.QueueWait || cfg.OpTimeout != d.OpTimeout ||
		cfg.MaxWaitersPerResource != d.MaxWaitersPerResource || cfg.MaxWaitersPerTenant != d.MaxWaitersPerTenant {
		t.Fatalf("default tuning %+v, want the service's defaults", c.tune)
	}
	c, err = parseFlags([]string{"--service-max-in-flight", "100", "--service-max-queued", "7", "--service-queue-wait", "1.5s", "--service-op-timeout", "2500ms",
		"--service-max-waiters-per-tenant", "5000"})
	if err != nil {
		t.Fatal(err)
	}
	want := tuning{maxInFlight: 100, maxQueued: 7, queueWait: 1500 * time.Millisecond, opTimeout: 2500 * time.Millisecond,
		maxWaitersPerResource: d.MaxWaitersPerResource, maxWaitersPerTenant: 5000}
	if c.tune != want {
		t.Fatalf("tuning %+v, want %+v", c.tune, want)
	}
	if s := c.settings(); s["service_queue_wait"] != "1.5s" || s["service_max_in_flight"] != "100" {
		t.Fatalf("settings %v", s)
	}
	fs := flag.NewFlagSet(cmdService, flag.ContinueOnError)
	var child tuning
	child.register(fs, "")
	if err := fs.Parse(c.tune.args()); err != nil || child != want {
		t.Fatalf("child's tuning %+v (%v), want %+v", child, err, want)
	}
}

// The servers of an existing deployment are --server, as lockd's, jetlock's
// and the nats CLI's; -s and the old --url name it too.
func TestServerFlagNames(t *testing.T) {
	for _, args := range [][]string{{"--server", "nats://a:4222"}, {"-s", "nats://a:4222"}, {"--url", "nats://a:4222"}, {"--server=nats://a:4222"}} {
		c, err := parseFlags(args)
		if err != nil || c.url != "nats://a:4222" || c.serviceMode != "none" {
			t.Errorf("%v: url %q, service %q, err %v", args, c.url, c.serviceMode, err)
		}
	}
}

// The usage names every flag with two dashes (one letter with one), as
// lockd's and jetlock's do.
func TestUsagePrintsTwoDashes(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	c.flags.SetOutput(&out)
	printFlags(c.flags)
	for _, want := range []string{"\n  --server string\n", "\n  -s string\n", "\n  --scenario string\n", "(default steady)", "\n  --carried-rate float\n"} {
		if !strings.Contains("\n"+out.String(), want) {
			t.Errorf("usage lacks %q", want)
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "  -") && !strings.HasPrefix(line, "  --") && !strings.HasPrefix(line, "  -s ") {
			t.Errorf("one dash: %q", line)
		}
	}
}

// A service process gets its users as flags every lockd takes, and the
// bench's own service process reads them.
func TestServiceUsersAreFlags(t *testing.T) {
	if got := serviceUsers(nil); got != nil {
		t.Fatalf("users without a cluster: %q", got)
	}
	fs := flag.NewFlagSet("lockd", flag.ContinueOnError)
	var user, password, storeUser, storePassword string
	fs.StringVar(&user, "user", "", "")
	fs.StringVar(&password, "password", "", "")
	fs.StringVar(&storeUser, "store-user", "", "")
	fs.StringVar(&storePassword, "store-password", "", "")
	args := []string{userFlags[devcluster.Service][0], "jetlock-service", userFlags[devcluster.Service][1], "p1",
		userFlags[devcluster.Store][0], "jetlock-store", userFlags[devcluster.Store][1], "p2"}
	if err := fs.Parse(args); err != nil || user != "jetlock-service" || password != "p1" || storeUser != "jetlock-store" || storePassword != "p2" {
		t.Fatalf("%q parsed as %q %q %q %q (%v)", args, user, password, storeUser, storePassword, err)
	}
}
