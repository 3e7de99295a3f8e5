package main

import (
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/internal/batchconn"
)

// conn is how to reach NATS as one user: the flags of one of lockd's two
// connections.
type conn struct {
	Creds       string `help:"NATS credentials file." env:"CREDS" type:"existingfile"`
	NKey        string `help:"NATS NKey seed file." name:"nkey" env:"NKEY" type:"existingfile"`
	User        string `help:"NATS user name." env:"USER"`
	Password    string `help:"NATS password." env:"PASSWORD"`
	InboxPrefix string `help:"Inbox prefix; the user's permissions should allow subscribing only under it." env:"INBOX_PREFIX"`
}

// serverFlags are the servers and TLS settings every connection shares.
type serverFlags struct {
	URL     string `help:"NATS server URL(s), comma separated (ignored with --dev)." default:"nats://127.0.0.1:4222" env:"NATS_URL"`
	TLSCert string `help:"TLS client certificate." name:"tls-cert" env:"NATS_CERT" type:"existingfile"`
	TLSKey  string `help:"TLS client key." name:"tls-key" env:"NATS_KEY" type:"existingfile"`
	TLSCA   string `help:"TLS CA certificate." name:"tls-ca" env:"NATS_CA" type:"existingfile"`
}

// connFlags are lockd's connection settings: the servers, TLS, and the two
// users. Requests are served as one user, which must have no rights on
// $JS, $KV and $SYS, because a request names the subject its reply goes
// to; the bucket is reached as the other (see deploy/).
type connFlags struct {
	serverFlags `embed:""`

	Requests conn `embed:"" prefix:"" envprefix:"NATS_" group:"Request connection: answers requests; its user must have no rights on $JS, $KV, $SYS"`
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
