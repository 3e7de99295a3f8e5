package devcluster

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/internal/batchconn"
	"github.com/jetlock/jetlock/streams"
)

// The dev cluster runs with the least-privilege model of deploy/: lock
// state lives in account Account, where the service's two users and the
// read-only inspector are; callers live in account CallersAccount and
// operators in OperatorsAccount, and both reach the service only through
// imports of its request subjects, which the server stamps with the
// sender's identity (Nats-Request-Info). A caller can therefore not see
// the bucket, call the JetStream API or subscribe to the service's
// subjects, whatever reply subject it sets, and the service knows an
// operator's revoke from a forged one.
const (
	// Account holds the lock bucket, the service and the operators.
	Account = "JETLOCK"
	// CallersAccount holds the callers.
	CallersAccount = "CALLERS"
	// OperatorsAccount holds the operators: they reach every request
	// subject, admin.revoke included, through imports, so that the server
	// vouches for who they are.
	OperatorsAccount = "OPERATORS"
	// AppAccount is an application's own account: it imports the
	// service like CallersAccount, and has JetStream and every right
	// within itself, for tests whose protected resources live in NATS
	// (client/fence's KV guard).
	AppAccount = "APP"
	// SystemAccount is the system account.
	SystemAccount = "SYS"
)

// Role is a kind of NATS user of the dev cluster.
type Role string

// Roles of the dev cluster.
const (
	// Caller may send the contract's requests (not admin) and receive
	// replies. A connection without credentials is a caller.
	Caller Role = "caller"
	// Operator may also call admin requests (revoke), from account
	// OperatorsAccount. Its user and password are both "operator"
	// (loopback only).
	Operator Role = "operator"
	// Inspector may inspect the bucket read only (nats kv get/ls/watch,
	// nats stream info, jetlock watch) and the service's micro endpoints,
	// hand the bucket's stream leadership over (lockd handover), and send
	// no request. Its user and password are both "inspector"
	// (loopback only).
	Inspector Role = "inspector"
	// Service is the service's request connection: it answers requests,
	// publishes wake messages and heartbeats, and has no rights on $JS,
	// $KV or $SYS.
	Service Role = "service"
	// Store is the service's bucket connection: the JetStream API and the
	// KV subjects, nothing else.
	Store Role = "store"
	// App is an application with an account of its own (AppAccount):
	// a caller of the service with every right in its own account.
	App Role = "app"
	// Admin has every right in Account, as every user of a deployment
	// without permissions has: for tests that show what the service does
	// when nothing else protects it.
	Admin Role = "admin"
)

// Roles lists every role.
var Roles = []Role{Caller, Operator, Inspector, Service, Store, App, Admin}

// OperatorPassword is the dev operator's password, InspectorPassword the
// dev inspector's.
const (
	OperatorPassword  = "operator"
	InspectorPassword = "inspector"
)

// userNames maps each role to its NATS user name.
var userNames = map[Role]string{
	Caller:    "caller",
	Operator:  "operator",
	Inspector: "inspector",
	Service:   "jetlock-service",
	Store:     "jetlock-store",
	App:       "app",
	Admin:     "admin",
}

// InboxPrefix returns the inbox prefix a connection of role must use: the
// service's connections have their own, so that no other user that may
// subscribe to "_INBOX.>" sees their replies (a read of the bucket carries
// lease ids).
func InboxPrefix(r Role) string {
	switch r {
	case Service:
		return streams.ServiceInboxPrefix
	case Store:
		return streams.StoreInboxPrefix
	}
	return nats.InboxPrefix[:len(nats.InboxPrefix)-1]
}

// credentials holds the passwords of a cluster's users. The service's users
// get random passwords at each start; only this process knows them.
type credentials map[Role]string

func newCredentials() credentials {
	return credentials{
		Caller:    "",
		Operator:  OperatorPassword,
		Inspector: InspectorPassword,
		Service:   randomPassword(),
		Store:     randomPassword(),
		App:       randomPassword(),
		Admin:     randomPassword(),
	}
}

func randomPassword() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// adminOp reports whether op is kept to operators: the operations under
// "admin." (streams.OpRevoke), exported to OperatorsAccount alone.
func adminOp(op string) bool { return strings.HasPrefix(op, "admin.") }

// authConfig renders the accounts section of a node's configuration for
// the request subjects under prefix.
func authConfig(prefix string, creds credentials) string {
	q := func(ss ...string) string {
		out := make([]string, len(ss))
		for i, s := range ss {
			out[i] = fmt.Sprintf("%q", s)
		}
		return "[" + strings.Join(out, ", ") + "]"
	}
	// Every operation of the contract (sessions included) is exported and
	// imported with share: true, so that the server stamps the sender on
	// each request; callers import all but admin's, operators all.
	var exports, imports, callerPub, opImports, opPub []string
	for _, op := range streams.Operations {
		subj := streams.Subject(prefix, op)
		imp := fmt.Sprintf("{service: {account: %s, subject: %q}, share: true}", Account, subj)
		opImports = append(opImports, imp)
		opPub = append(opPub, subj)
		if adminOp(op) {
			exports = append(exports, fmt.Sprintf("{service: %q, accounts: [%s]}", subj, OperatorsAccount))
			continue
		}
		// The server forgets an import's reply route after its response
		// threshold (2 minutes by default); a waiting acquire answers
		// after up to MaxWait (5 minutes) plus its request budget.
		threshold := ""
		if op == streams.OpAcquire {
			threshold = `, response_threshold: "6m"`
		}
		exports = append(exports, fmt.Sprintf("{service: %q%s}", subj, threshold))
		imports = append(imports, imp)
		callerPub = append(callerPub, subj)
	}
	// Election events (streams.EventSubject) are a stream export: callers
	// and operators may subscribe to them.
	events := prefix + ".events.>"
	exports = append(exports, fmt.Sprintf("{stream: %q}", events))
	evImport := fmt.Sprintf("{stream: {account: %s, subject: %q}}", Account, events)
	imports = append(imports, evImport)
	opImports = append(opImports, evImport)
	// The inspector's JetStream rights: reads, and the bucket streams'
	// leader step-down (lockd handover, the pre-stop step of a node).
	inspectorJS := []string{
		"$JS.API.INFO", "$JS.API.STREAM.INFO.>", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
		"$JS.API.STREAM.LEADER.STEPDOWN.KV_>",
		"$JS.API.STREAM.MSG.GET.>", "$JS.API.DIRECT.GET.>",
		"$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DELETE.>", "$JS.API.CONSUMER.INFO.>",
		"$JS.API.CONSUMER.NAMES.>", "$JS.API.CONSUMER.LIST.>", "$JS.API.CONSUMER.MSG.NEXT.>",
		"$JS.FC.>", "$JS.ACK.>",
	}
	return fmt.Sprintf(`
accounts {
  %[1]s {
    jetstream: enabled
    users: [
      {user: %[2]q, password: %[3]q, permissions: {
        publish: {allow: [">"], deny: ["$JS.>", "$KV.>", "$SYS.>", "$O.>", "$JSC.>", "$MQTT.>"]}
        subscribe: {allow: [%[4]q, "$SRV.>", %[5]q]}
      }}
      {user: %[6]q, password: %[7]q, permissions: {
        publish: {allow: ["$JS.API.>", "$KV.>", "$JS.ACK.>", "$JS.FC.>"]}
        subscribe: {allow: [%[8]q]}
      }}
      {user: %[23]q, password: %[24]q, permissions: {
        publish: {allow: %[11]s}
        subscribe: {allow: ["_INBOX.>"]}
      }}
      {user: %[21]q, password: %[22]q}
    ]
    exports: [%[12]s]
  }
  %[25]s {
    users: [
      {user: %[9]q, password: %[10]q, permissions: {
        publish: {allow: %[26]s}
        subscribe: {allow: ["_INBOX.>", %[28]q]}
      }}
    ]
    imports: [%[27]s]
  }
  %[13]s {
    users: [
      {user: %[14]q, permissions: {
        publish: {allow: %[15]s}
        subscribe: {allow: ["_INBOX.>", %[28]q]}
      }}
    ]
    imports: [%[16]s]
  }
  %[18]s {
    jetstream: enabled
    users: [{user: %[19]q, password: %[20]q}]
    imports: [%[16]s]
  }
  %[17]s {}
}
system_account: %[17]s
no_auth_user: %[14]q
`,
		Account,
		userNames[Service], creds[Service], prefix+".>", InboxPrefix(Service)+".>",
		userNames[Store], creds[Store], InboxPrefix(Store)+".>",
		userNames[Operator], creds[Operator], q(append([]string{"$SRV.>"}, inspectorJS...)...),
		strings.Join(exports, ", "),
		CallersAccount, userNames[Caller], q(callerPub...), strings.Join(imports, ", "),
		SystemAccount,
		AppAccount, userNames[App], creds[App],
		userNames[Admin], creds[Admin],
		userNames[Inspector], creds[Inspector],
		OperatorsAccount, q(opPub...), strings.Join(opImports, ", "),
		events,
	)
}

// ConnectOptions returns the options a connection of role needs: its user
// and password (none for a caller) and its inbox prefix.
func (c *Cluster) ConnectOptions(r Role) []nats.Option {
	opts := []nats.Option{nats.CustomInboxPrefix(InboxPrefix(r))}
	if r != Caller {
		opts = append(opts, nats.UserInfo(userNames[r], c.creds[r]))
	}
	return opts
}

// User returns the user name and password of role (an empty password for
// the caller, which needs none).
func (c *Cluster) User(r Role) (user, password string) { return userNames[r], c.creds[r] }

// ConnectService opens the service's two connections to the cluster, as
// its users: one for requests and one for the bucket (see service.New).
// Both reconnect forever and gather their writes into fewer system calls
// (internal/batchconn), as lockd's do; opts are added to both.
func (c *Cluster) ConnectService(opts ...nats.Option) (requests, store *nats.Conn, err error) {
	base := append([]nats.Option{nats.MaxReconnects(-1), batchconn.Option()}, opts...)
	requests, err = nats.Connect(c.URLs(), append(append(base, nats.Name("jetlock-service")), c.ConnectOptions(Service)...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("devcluster: service connection: %w", err)
	}
	store, err = nats.Connect(c.URLs(), append(append(base, nats.Name("jetlock-store")), c.ConnectOptions(Store)...)...)
	if err != nil {
		requests.Close()
		return nil, nil, fmt.Errorf("devcluster: store connection: %w", err)
	}
	return requests, store, nil
}
