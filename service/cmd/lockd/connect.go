package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/internal/batchconn"
)

// lockd's flags are named as the nats CLI's (and jetlock's) are, but its
// environment variables are its own, all under JETLOCK_: a shell set up
// for `nats` (NATS_URL, NATS_USER, NATS_CREDS, ...) must not change whom
// lockd connects as, or where.

// conn is how to reach NATS as one user: the flags of one of lockd's two
// connections. NKey is the path of a seed file (SU...).
type conn struct {
	Creds       string `help:"NATS credentials file." env:"CREDS" type:"existingfile"`
	NKey        string `help:"NATS NKey seed file (SU...)." name:"nkey" env:"NKEY" type:"existingfile"`
	User        string `help:"NATS user name." env:"USER"`
	Password    string `help:"NATS password." env:"PASSWORD"`
	InboxPrefix string `help:"Inbox prefix; the user's permissions should allow subscribing only under it." env:"INBOX_PREFIX"`
}

// serverFlags are the servers and TLS settings every connection shares.
// The names before the nats CLI's (--url, --tls-cert, --tls-key,
// --tls-ca) still work, unlisted, so that deployed command lines keep
// working; lockd warns when they are used (see deprecatedFlags).
type serverFlags struct {
	Server  string `help:"NATS server URL(s), comma separated (ignored with --dev)." short:"s" aliases:"url" default:"nats://127.0.0.1:4222" env:"JETLOCK_SERVER" placeholder:"URL"`
	TLSCert string `help:"TLS client certificate." name:"tlscert" aliases:"tls-cert" env:"JETLOCK_TLSCERT" type:"existingfile"`
	TLSKey  string `help:"TLS client key." name:"tlskey" aliases:"tls-key" env:"JETLOCK_TLSKEY" type:"existingfile"`
	TLSCA   string `help:"TLS CA certificate." name:"tlsca" aliases:"tls-ca" env:"JETLOCK_TLSCA" type:"existingfile"`
}

// connFlags are lockd's connection settings: the servers, TLS, and the two
// users. Requests are served as one user, which must have no rights on
// $JS, $KV and $SYS, because a request names the subject its reply goes
// to; the bucket is reached as the other (see deploy/).
type connFlags struct {
	serverFlags `embed:""`

	Requests conn `embed:"" prefix:"" envprefix:"JETLOCK_" group:"Request connection: answers requests; its user must have no rights on $JS, $KV, $SYS"`
	Store    conn `embed:"" prefix:"store-" envprefix:"JETLOCK_STORE_" group:"Store connection: the bucket and the JetStream API"`
}

// options returns the nats.Options of one connection.
func (f *serverFlags) options(c conn, name, defaultInbox string) ([]nats.Option, error) {
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), batchconn.Option()}
	if c.Creds != "" {
		opts = append(opts, nats.UserCredentials(c.Creds))
	}
	if c.NKey != "" {
		o, err := nats.NkeyOptionFromSeed(c.NKey)
		if err != nil {
			return nil, fmt.Errorf("nkey %s: %w", c.NKey, err)
		}
		opts = append(opts, o)
	}
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if f.TLSCert != "" || f.TLSKey != "" {
		opts = append(opts, nats.ClientCert(f.TLSCert, f.TLSKey))
	}
	if f.TLSCA != "" {
		opts = append(opts, nats.RootCAs(f.TLSCA))
	}
	inbox := c.InboxPrefix
	if inbox == "" {
		inbox = defaultInbox
	}
	return append(opts, nats.CustomInboxPrefix(inbox)), nil
}

// sameUser reports whether the two connections are configured with the
// same credentials (or none), and so have the same rights.
func (f *connFlags) sameUser() bool {
	r, s := f.Requests, f.Store
	return r.Creds == s.Creds && r.NKey == s.NKey && r.User == s.User
}

// renamedFlags maps the flags lockd had before it took the nats CLI's
// names to their names now.
var renamedFlags = map[string]string{"url": "server", "tls-cert": "tlscert", "tls-key": "tlskey", "tls-ca": "tlsca"}

// deprecatedFlags returns a warning for each old flag name in args.
func deprecatedFlags(args []string) []string {
	var out []string
	for _, a := range args {
		if a == "--" {
			break
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if now, ok := renamedFlags[name]; ok && strings.HasPrefix(a, "--") {
			out = append(out, fmt.Sprintf("--%s is deprecated: use --%s", name, now))
		}
	}
	return out
}

// natsCLIEnv are the nats CLI's environment variables that lockd read
// before it took its own, with the variable that replaces each.
var natsCLIEnv = map[string]string{
	"NATS_URL": "JETLOCK_SERVER", "NATS_CREDS": "JETLOCK_CREDS", "NATS_NKEY": "JETLOCK_NKEY",
	"NATS_USER": "JETLOCK_USER", "NATS_PASSWORD": "JETLOCK_PASSWORD", "NATS_INBOX_PREFIX": "JETLOCK_INBOX_PREFIX",
	"NATS_CERT": "JETLOCK_TLSCERT", "NATS_KEY": "JETLOCK_TLSKEY", "NATS_CA": "JETLOCK_TLSCA",
}

// ignoredEnv returns a note for each of the nats CLI's variables that is
// set: lockd does not read them (an operator's shell often has them), and
// a deployment that set them for an older lockd must move to JETLOCK_.
func ignoredEnv(lookup func(string) (string, bool)) []string {
	var out []string
	for v, now := range natsCLIEnv {
		if _, ok := lookup(v); ok {
			out = append(out, fmt.Sprintf("%s is set but lockd does not read it (it is the nats CLI's); lockd's is %s", v, now))
		}
	}
	slices.Sort(out)
	return out
}

// credentialFlags name, for each of lockd's connections, the flags and
// variables of its credentials: what to check when the server refuses
// them.
var credentialFlags = map[string]string{
	"request": "--creds, --nkey or --user/--password (JETLOCK_CREDS, JETLOCK_NKEY, JETLOCK_USER, JETLOCK_PASSWORD)",
	"store":   "--store-creds, --store-nkey or --store-user/--store-password (JETLOCK_STORE_CREDS, JETLOCK_STORE_NKEY, JETLOCK_STORE_USER, JETLOCK_STORE_PASSWORD)",
}

// connectError is the error of a failed connection of lockd's which
// ("request" or "store") to url. Refused credentials are a usage error
// that names the flags to check: no retry mends them.
func connectError(url, which string, err error) error {
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) {
		return usageError("connect %s (%s connection): %v: the server refused the credentials; check %s", url, which, err, credentialFlags[which])
	}
	return fmt.Errorf("connect %s (%s connection): %w", url, which, err)
}
