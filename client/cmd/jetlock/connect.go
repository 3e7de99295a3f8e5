package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/jsm.go/natscontext"
	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/streams"
)

// globals are the connection flags every command shares, named like the
// nats CLI's.
type globals struct {
	Server   string        `short:"s" env:"NATS_URL" placeholder:"URL" help:"NATS server URL(s), comma separated (default nats://127.0.0.1:4222, or the context's)."`
	Context  string        `name:"context" env:"NATS_CONTEXT" placeholder:"NAME" help:"nats CLI context to connect with (see 'nats context ls'); flags given override its settings."`
	Creds    string        `env:"NATS_CREDS" type:"existingfile" placeholder:"FILE" help:"NATS user credentials file."`
	User     string        `env:"NATS_USER" placeholder:"USER" help:"NATS user name."`
	Password string        `env:"NATS_PASSWORD" placeholder:"PASSWORD" help:"NATS password."`
	NKey     string        `name:"nkey" env:"NATS_NKEY" type:"existingfile" placeholder:"FILE" help:"NATS NKey seed file."`
	TLSCert  string        `name:"tlscert" env:"NATS_CERT" type:"existingfile" placeholder:"FILE" help:"TLS client certificate."`
	TLSKey   string        `name:"tlskey" env:"NATS_KEY" type:"existingfile" placeholder:"FILE" help:"TLS client key."`
	TLSCA    string        `name:"tlsca" env:"NATS_CA" type:"existingfile" placeholder:"FILE" help:"TLS CA certificate."`
	Prefix   string        `default:"jetlock" env:"JETLOCK_PREFIX" help:"Subject prefix of the jetlock service."`
	Timeout  time.Duration `default:"5s" env:"JETLOCK_TIMEOUT" help:"How long one request waits for its reply."`
}

// validate checks the shared flags.
func (g *globals) validate() error {
	if g.Timeout < 100*time.Millisecond || g.Timeout > 10*time.Minute {
		return usagef("--timeout %s outside [100ms, 10m]", durationText(g.Timeout))
	}
	if g.Prefix == "" {
		return usagef("--prefix is empty")
	}
	return nil
}

// session is an open connection and a jetlock client on it. Its ctx is
// cancelled with cause errPermission when the server refuses one of the
// connection's publishes or subscriptions, so that a request nobody may
// send fails at once instead of timing out.
type session struct {
	nc     *nats.Conn
	c      *client.Client
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// connect opens the session. A connection that cannot be made is exit 69;
// refused credentials are exit 77.
func (g *globals) connect() (*session, error) {
	if err := g.validate(); err != nil {
		return nil, err
	}
	var opts []natscontext.Option
	add := func(v string, o func(string) natscontext.Option) {
		if v != "" {
			opts = append(opts, o(v))
		}
	}
	add(g.Server, natscontext.WithServerURL)
	add(g.Creds, natscontext.WithCreds)
	add(g.User, natscontext.WithUser)
	add(g.Password, natscontext.WithPassword)
	add(g.NKey, natscontext.WithNKey)
	add(g.TLSCert, natscontext.WithCertificate)
	add(g.TLSKey, natscontext.WithKey)
	add(g.TLSCA, natscontext.WithCA)
	var nctx *natscontext.Context
	var err error
	if g.Context != "" {
		nctx, err = natscontext.New(g.Context, true, opts...)
		if err != nil {
			return nil, usagef("--context %s: %v", g.Context, err)
		}
	} else if nctx, err = natscontext.New("", false, opts...); err != nil {
		return nil, usagef("%v", err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	nopts, err := nctx.NATSOptions(
		nats.Name("jetlock"),
		nats.Timeout(g.Timeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				cancel(fmt.Errorf("%w: %s", errPermission, clean(err)))
			}
		}),
	)
	if err != nil {
		cancel(nil)
		return nil, usagef("connection settings: %v", err)
	}
	nc, err := nats.Connect(nctx.ServerURL(), nopts...)
	if err != nil {
		cancel(nil)
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) {
			return nil, kindf(exitNoPerm, codePermission, "connect to %s: %v: the server refused the credentials; check --user/--password, --creds, --nkey or --context (NATS_USER, NATS_PASSWORD, NATS_CREDS, NATS_NKEY, NATS_CONTEXT)", nctx.ServerURL(), err)
		}
		return nil, kindf(exitUnavailable, streams.CodeUnavailable, "connect to %s: %v", nctx.ServerURL(), err)
	}
	c, err := client.New(nc, client.WithPrefix(g.Prefix), client.WithRequestTimeout(g.Timeout))
	if err != nil {
		nc.Close()
		cancel(nil)
		return nil, usagef("%v", err)
	}
	return &session{nc: nc, c: c, ctx: ctx, cancel: cancel}, nil
}

// close waits for the client's cleanups (the cancel of an acquire given
// up, the release of a lease granted as it was given up: each bounded by
// --timeout), then closes the connection.
func (s *session) close() {
	_ = s.c.Close()
	s.nc.Close()
	s.cancel(nil)
}

// fail turns err into the command's exit, preferring a permission
// refusal seen on the connection over the timeout it caused.
func (s *session) fail(err error) error {
	if cause := context.Cause(s.ctx); errors.Is(cause, errPermission) {
		return classify(cause)
	}
	return classify(err)
}

// request connects, makes the requests of fn within one operation's budget
// (opCtx) and closes the connection. An error of fn is mapped to the
// command's exit code (see fail).
func (g *globals) request(fn func(ctx context.Context, c *client.Client) error) error {
	s, err := g.connect()
	if err != nil {
		return err
	}
	defer s.close()
	ctx, cancel := s.opCtx(g, 0)
	defer cancel()
	if err := fn(ctx, s.c); err != nil {
		return s.fail(err)
	}
	return nil
}

// opCtx bounds one operation of a script command: the request timeout
// twice over (a retry after an unknown outcome), plus extra.
func (s *session) opCtx(g *globals, extra time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.ctx, 2*g.Timeout+extra)
}

// untilInterrupted bounds a command that follows changes: its context
// ends at Ctrl-C or SIGTERM, with the session, or after d (--for) when d
// is positive. stop releases it.
func (s *session) untilInterrupted(d time.Duration) (ctx context.Context, stop func()) {
	ctx, unnotify := signal.NotifyContext(s.ctx, os.Interrupt, syscall.SIGTERM)
	if d <= 0 {
		return ctx, unnotify
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, func() { cancel(); unnotify() }
}
