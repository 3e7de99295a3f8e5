package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
)

// lockd's identity comes from its flags and its own JETLOCK_ variables
// only: a shell set up for the nats CLI as someone else (NATS_URL,
// NATS_USER, NATS_CREDS, ...) changes neither the servers lockd reaches
// nor the users it connects as, nor its inbox.
func TestNATSEnvironmentDoesNotChangeIdentity(t *testing.T) {
	env := testenv.Start(t)
	su, sp := env.Cluster.User(devcluster.Service)
	tu, tp := env.Cluster.User(devcluster.Store)
	missing := t.TempDir() + "/missing"
	for _, tc := range []struct {
		name string
		nats map[string]string // the nats CLI's variables
	}{
		{"the nats CLI as the operator", map[string]string{
			"NATS_URL": env.Cluster.URLs(), "NATS_USER": "operator", "NATS_PASSWORD": devcluster.OperatorPassword,
			"NATS_INBOX_PREFIX": "_INBOX_operator",
		}},
		{"the nats CLI with files", map[string]string{
			"NATS_URL": "nats://127.0.0.1:1", "NATS_USER": "operator", "NATS_CREDS": missing, "NATS_NKEY": missing,
			"NATS_CERT": missing, "NATS_KEY": missing, "NATS_CA": missing,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.nats {
				t.Setenv(k, v)
			}
			// lockd's own
			for k, v := range map[string]string{"JETLOCK_SERVER": env.Cluster.URLs(), "JETLOCK_USER": su, "JETLOCK_PASSWORD": sp,
				"JETLOCK_STORE_USER": tu, "JETLOCK_STORE_PASSWORD": tp} {
				t.Setenv(k, v)
			}
			l := startLockd(t)
			defer l.shutdown(t)
			if !strings.Contains(l.stderr.String(), "NATS_USER is set but lockd does not read it") {
				t.Errorf("lockd did not say it ignores NATS_USER:\n%s", l.stderr.String())
			}
			want := map[string]string{"jetlock-lockd": su, "jetlock-lockd-store": tu}
			waitFor(t, 10*time.Second, func() string {
				seen := map[string]string{}
				for i := range devcluster.Size {
					cz, err := env.Cluster.Server(i).Connz(&server.ConnzOptions{Username: true, Subscriptions: true})
					if err != nil {
						return err.Error()
					}
					for _, c := range cz.Conns {
						if _, ok := want[c.Name]; !ok {
							continue
						}
						seen[c.Name] = c.AuthorizedUser
						for _, sub := range c.Subs {
							if strings.HasPrefix(sub, "_INBOX_operator") {
								t.Fatalf("%s subscribes %s: NATS_INBOX_PREFIX was used", c.Name, sub)
							}
						}
					}
				}
				for name, user := range want {
					if seen[name] != user {
						return "connections as " + fmtMap(seen) + ", want " + fmtMap(want)
					}
				}
				return ""
			})
		})
	}
}

func fmtMap(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return "{" + strings.Join(parts, " ") + "}"
}
