package deploytest

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testca"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

// Every server configuration of deploy/nats parses with nats-server's own
// parser, its includes and environment variables resolved as README.md
// says, and says what deploy/README.md requires ("Durability", "The
// users"): its zone tag, unique_tag "az:", fsync on every write, JetStream
// limits, routes to all three zones, mutual TLS on clients and routes, and
// the accounts of the model.
func TestServerConfigsParse(t *testing.T) {
	ks := setIdentities(t)
	dir := t.TempDir()
	ca, err := testca.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Server("server"); err != nil {
		t.Fatal(err)
	}
	files := confFiles(t)
	for _, s := range servers {
		if !slices.Contains(files, s.name+".conf") {
			t.Fatalf("deploy/nats has no %s.conf: %v", s.name, files)
		}
	}
	// Every file names only the identities README.md lists.
	for _, f := range files {
		for _, ref := range envRefs(readDeploy(t, filepath.Join("nats", f))) {
			if _, ok := identities[ref]; !ok {
				t.Errorf("%s refers to $%s, which is not one of README.md's identities", f, ref)
			}
		}
	}
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			d := filepath.Join(dir, s.name)
			render(t, d, [][2]string{{tlsDir, dir + "/"}, {storeDir, filepath.Join(d, "data")}})
			o := parse(t, filepath.Join(d, s.name+".conf"))
			checkServer(t, o, s.name, s.zone)
			checkAccounts(t, o, ks)
			checkRequestSubjects(t, filepath.Join(d, s.name+".conf"))
		})
	}
	// A server without an identity in its environment does not start.
	os.Unsetenv("JETLOCK_STORE_NKEY_PUBLIC")
	d := filepath.Join(dir, "unset")
	render(t, d, [][2]string{{tlsDir, dir + "/"}, {storeDir, filepath.Join(d, "data")}})
	if _, err := server.ProcessConfigFile(filepath.Join(d, "nats-a.conf")); err == nil || !strings.Contains(err.Error(), "JETLOCK_STORE_NKEY_PUBLIC") {
		t.Fatalf("nats-a.conf without JETLOCK_STORE_NKEY_PUBLIC: %v, want an error naming it", err)
	}
}

func checkServer(t *testing.T, o *server.Options, name, zone string) {
	t.Helper()
	if o.ServerName != name || !slices.Equal([]string(o.Tags), []string{zone}) {
		t.Errorf("server name %q tags %v, want %q [%s]", o.ServerName, o.Tags, name, zone)
	}
	if !o.JetStream || !o.SyncAlways || o.JetStreamUniqueTag != "az:" {
		t.Errorf("jetstream %v sync always %v unique tag %q", o.JetStream, o.SyncAlways, o.JetStreamUniqueTag)
	}
	if o.JetStreamMaxMemory <= 0 || o.JetStreamMaxStore <= 0 {
		t.Errorf("JetStream limits memory %d store %d, want both set", o.JetStreamMaxMemory, o.JetStreamMaxStore)
	}
	if o.Port != clientPort || o.Cluster.Port != routePort || o.HTTPPort != monitorPort {
		t.Errorf("ports client %d route %d monitor %d, want %d %d %d", o.Port, o.Cluster.Port, o.HTTPPort, clientPort, routePort, monitorPort)
	}
	var routes []string
	for _, r := range o.Routes {
		routes = append(routes, r.Host)
	}
	if want := []string{"nats-a:6222", "nats-b:6222", "nats-c:6222"}; !slices.Equal(routes, want) {
		t.Errorf("routes %v, want %v", routes, want)
	}
	if o.TLSConfig == nil || o.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("client TLS %v, want mutual TLS", o.TLSConfig)
	}
	if o.Cluster.TLSConfig == nil || !o.Cluster.TLSCheckKnownURLs {
		t.Errorf("route TLS %v check known URLs %v, want mutual TLS with the route hosts checked", o.Cluster.TLSConfig != nil, o.Cluster.TLSCheckKnownURLs)
	}
	if o.NoAuthUser != "" || len(o.Users) != 0 {
		t.Errorf("no_auth_user %q, %d password users: want every user an nkey", o.NoAuthUser, len(o.Users))
	}
	if o.SystemAccount != "SYS" {
		t.Errorf("system account %q", o.SystemAccount)
	}
	// The bench's nodes (devcluster) stop in lame duck mode with these
	// settings, so that what it measures of a stop is what a deployed
	// server does (docs/operations.md, "Planned maintenance").
	if o.LameDuckDuration != devcluster.LameDuckDuration || o.LameDuckGracePeriod != devcluster.LameDuckGracePeriod {
		t.Errorf("lame duck duration %v, grace period %v; the bench's nodes use %v, %v",
			o.LameDuckDuration, o.LameDuckGracePeriod, devcluster.LameDuckDuration, devcluster.LameDuckGracePeriod)
	}
}

// checkAccounts checks the users of each role: in the right account, with
// the permissions of deploy/README.md's table "The users".
func checkAccounts(t *testing.T, o *server.Options, ks keys) {
	t.Helper()
	users := map[string]*server.NkeyUser{}
	for _, u := range o.Nkeys {
		users[u.Nkey] = u
	}
	account := map[string]string{"service": "JETLOCK", "store": "JETLOCK", "inspector": "JETLOCK", "operator": "OPERATORS",
		"orders": "CALLERS", "billing": "CALLERS", "sys": "SYS"}
	for role, acc := range account {
		u := users[ks.public(t, role)]
		if u == nil {
			t.Errorf("no user for %s", role)
			continue
		}
		if u.Account == nil || u.Account.Name != acc {
			t.Errorf("%s in account %v, want %s", role, u.Account, acc)
		}
	}
	pubAllow := func(role string) []string {
		u := users[ks.public(t, role)]
		if u == nil || u.Permissions == nil || u.Permissions.Publish == nil {
			return nil
		}
		return u.Permissions.Publish.Allow
	}
	subAllow := func(role string) []string {
		u := users[ks.public(t, role)]
		if u == nil || u.Permissions == nil || u.Permissions.Subscribe == nil {
			return nil
		}
		return u.Permissions.Subscribe.Allow
	}
	for _, role := range []string{"orders", "billing"} {
		for _, s := range pubAllow(role) {
			if strings.HasPrefix(s, "$") || strings.Contains(s, "admin") || strings.Contains(s, ">") || strings.Contains(s, "*") {
				t.Errorf("caller %s may publish %q", role, s)
			}
		}
		for _, op := range streams.Operations {
			if subj := streams.Subject(streams.DefaultPrefix, op); !isAdmin(op) && !slices.Contains(pubAllow(role), subj) {
				t.Errorf("caller %s may not publish %s", role, subj)
			}
		}
		// Its own replies, and the election events (a stream export).
		if want := []string{"_INBOX_" + role + ".>", streams.DefaultPrefix + ".events.>"}; !slices.Equal(subAllow(role), want) {
			t.Errorf("caller %s may subscribe %v, want %v", role, subAllow(role), want)
		}
	}
	if u := users[ks.public(t, "service")]; u != nil {
		for _, s := range u.Permissions.Publish.Allow {
			if strings.HasPrefix(s, "$") || s == ">" {
				t.Errorf("the service's request user may publish %q", s)
			}
		}
		if !slices.Contains(subAllow("service"), streams.ServiceInboxPrefix+".>") {
			t.Errorf("the service's request user subscribes %v, without its inbox", subAllow("service"))
		}
	}
	if !slices.Equal(subAllow("store"), []string{streams.StoreInboxPrefix + ".>"}) {
		t.Errorf("the store user subscribes %v, want its inbox only", subAllow("store"))
	}
	// The request subjects are exported (admin only to the operators:
	// TestAccountSetup shows a caller cannot reach it), and a waiting
	// acquire's reply route lives as long as the longest wait lockd allows
	// (the server drops a response route after 2m by default).
	var jetlock *server.Account
	for _, a := range o.Accounts {
		if a.Name == "JETLOCK" {
			jetlock = a
		}
	}
	if jetlock == nil {
		t.Fatal("no account JETLOCK")
	}
	cfg := service.DefaultConfig()
	for _, op := range streams.Operations {
		subj := streams.Subject(streams.DefaultPrefix, op)
		thresh, err := jetlock.ServiceExportResponseThreshold(subj)
		switch {
		case err != nil:
			t.Errorf("%s: %v", op, err)
		case op == streams.OpAcquire && thresh < cfg.MaxWait+cfg.QueueWait+cfg.OpTimeout:
			t.Errorf("acquire's response threshold %v is below lockd's longest wait %v", thresh, cfg.MaxWait+cfg.QueueWait+cfg.OpTimeout)
		}
	}
	for _, s := range pubAllow("inspector") {
		if strings.HasPrefix(s, "$KV") || strings.Contains(s, "PURGE") || strings.Contains(s, "DELETE.") && !strings.Contains(s, "CONSUMER") ||
			s == "$JS.API.>" || strings.Contains(s, "STREAM.CREATE") || strings.Contains(s, "STREAM.UPDATE") || strings.HasPrefix(s, "jetlock.") {
			t.Errorf("the inspector may publish %q", s)
		}
	}
	if want := []string{"jetlock.v1.>"}; !slices.Equal(pubAllow("operator"), want) {
		t.Errorf("the operator may publish %v, want %v (through the imports)", pubAllow("operator"), want)
	}
}

// isAdmin reports whether op is kept to operators (it lies under "admin.").
func isAdmin(op string) bool { return strings.HasPrefix(op, "admin.") }

// checkRequestSubjects checks the exports and imports of every operation of
// the contract as the configuration file writes them (nats-server keeps
// both where a test cannot read them): account JETLOCK exports each to
// CALLERS and OPERATORS (admin operations to OPERATORS only), and CALLERS
// (all but admin) and OPERATORS (all) import each with share: true, so
// that the server stamps the sender's identity (Nats-Request-Info) on
// every request, which the service authorises, audits and rate-limits by.
func checkRequestSubjects(t *testing.T, file string) {
	t.Helper()
	top, err := conf.ParseFile(file)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	accounts, _ := top["accounts"].(map[string]any)
	list := func(account, key string) []map[string]any {
		a, _ := accounts[account].(map[string]any)
		items, _ := a[key].([]any)
		var out []map[string]any
		for _, it := range items {
			if m, ok := it.(map[string]any); ok {
				out = append(out, m)
			}
		}
		return out
	}
	strs := func(v any) []string {
		items, _ := v.([]any)
		var out []string
		for _, it := range items {
			s, _ := it.(string)
			out = append(out, s)
		}
		return out
	}
	exports := map[string][]string{}
	for _, e := range list("JETLOCK", "exports") {
		if subj, ok := e["service"].(string); ok {
			exports[subj] = strs(e["accounts"])
		}
	}
	imported := func(account, subj string) (found, shared bool) {
		for _, i := range list(account, "imports") {
			svc, _ := i["service"].(map[string]any)
			if svc["account"] == "JETLOCK" && svc["subject"] == subj {
				shared, _ := i["share"].(bool)
				return true, shared
			}
		}
		return false, false
	}
	for _, op := range streams.Operations {
		subj := streams.Subject(streams.DefaultPrefix, op)
		want := []string{"CALLERS", "OPERATORS"}
		if isAdmin(op) {
			want = []string{"OPERATORS"}
		}
		if got, ok := exports[subj]; !ok || !slices.Equal(got, want) {
			t.Errorf("%s exported to %v (exported: %v), want %v", subj, got, ok, want)
		}
		for _, account := range []string{"CALLERS", "OPERATORS"} {
			found, shared := imported(account, subj)
			switch {
			case account == "CALLERS" && isAdmin(op):
				if found {
					t.Errorf("%s imports %s", account, subj)
				}
			case !found:
				t.Errorf("%s does not import %s", account, subj)
			case !shared:
				t.Errorf("%s imports %s without share: true (no Nats-Request-Info)", account, subj)
			}
		}
	}
}
