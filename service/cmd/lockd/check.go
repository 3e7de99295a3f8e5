package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/jsm.go/monitor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/streams"
)

// checkCmd is `lockd check`: the drift of the bucket stream's live
// configuration and state from the definition in package streams.
type checkCmd struct {
	storeAccess `embed:""`
	bucketFlags `embed:""`

	JSON    bool          `help:"Print one JSON document: stream, first_seq, last_seq, high_water, leader, drifts (the remaining ones), fixed, warnings." name:"json"`
	Fix     bool          `help:"Put right the drifts that a stream update can, by tightening only (deny delete and purge, no roll-ups, atomic batches and message TTLs allowed); report what remains. Needs the store user's rights."`
	Timeout time.Duration `help:"Bound on each request to the JetStream API." default:"10s" env:"JETLOCK_CHECK_TIMEOUT"`
}

// storeAccess is the store connection of the commands that reach the
// bucket's stream without serving (check, handover).
type storeAccess struct {
	Dev      bool `help:"Reach the bucket of a running lockd --dev: its URLs and store user come from the dev directory (see --dev-dir)." env:"JETLOCK_DEV"`
	devFlags `embed:""`

	serverFlags `embed:""`
	Store       conn `embed:"" prefix:"store-" envprefix:"JETLOCK_STORE_" group:"Store connection: the bucket and the JetStream API (check: read-only rights suffice without --fix; handover: stream info and leader step-down, as deploy/'s inspector has; an inspector user needs --store-inbox-prefix _INBOX)"`

	denied chan error // permission violations, see asyncError
}

// checkReport is what check prints.
type checkReport struct {
	Stream    string          `json:"stream"`
	Exists    bool            `json:"exists"`
	FirstSeq  uint64          `json:"first_seq"`
	LastSeq   uint64          `json:"last_seq"`
	HighWater uint64          `json:"high_water"`
	Leader    string          `json:"leader,omitempty"`
	Drifts    []streams.Drift `json:"drifts"`
	Fixed     []streams.Drift `json:"fixed,omitempty"`
	FixError  string          `json:"fix_error,omitempty"`
	Warnings  []string        `json:"warnings,omitempty"`
}

func (c *checkCmd) Run(ctx context.Context, out *stdio) error {
	bc := c.bucketFlags.config()
	if err := bc.Validate(); err != nil {
		return usageError("%v", err)
	}
	if c.Timeout <= 0 {
		return usageError("--timeout must be positive")
	}
	nc, err := c.connect("jetlock-lockd-check", c.Timeout)
	if err != nil {
		return err
	}
	defer nc.Close()
	rep, err := c.check(ctx, nc, bc)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	if err := rep.print(out.out, c.JSON); err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	switch {
	case rep.FixError != "":
		return &exitError{code: exitUsage, err: fmt.Errorf("--fix: %s", rep.FixError)}
	case len(rep.Drifts) > 0:
		return &exitError{code: exitFailed} // reported above
	}
	return nil
}

// connect opens the store connection as name: the flags', or with --dev
// the one a running lockd --dev wrote down. Any failure is exit 2.
func (c *storeAccess) connect(name string, timeout time.Duration) (*nats.Conn, error) {
	url, cn := c.Server, c.Store
	if c.Dev {
		path := filepath.Join(c.DevDir, devStoreFile)
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil, usageError("no running lockd --dev found with --dev-dir %s (%s is missing)", c.DevDir, path)
		}
		if err != nil {
			return nil, usageError("%v", err)
		}
		var ds devStore
		if err := json.Unmarshal(b, &ds); err != nil {
			return nil, usageError("%s: %v", path, err)
		}
		url, cn = ds.URLs, conn{User: ds.User, Password: ds.Password}
	}
	opts, err := c.options(cn, name, streams.StoreInboxPrefix)
	if err != nil {
		return nil, usageError("%v", err)
	}
	c.denied = make(chan error, 1)
	nc, err := nats.Connect(url, append(opts, nats.Timeout(timeout), nats.ErrorHandler(c.asyncError))...)
	if err != nil {
		var ee *exitError
		if err = connectError(url, "store", err); !errors.As(err, &ee) {
			err = usageError("%v", err)
		}
		return nil, err
	}
	return nc, nil
}

// asyncError receives the server's asynchronous errors: a permission
// violation (the user may not call the API a request needs) is reported
// at once instead of after the request's timeout.
func (c *storeAccess) asyncError(_ *nats.Conn, _ *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrPermissionViolation) {
		select {
		case c.denied <- err:
		default:
		}
	}
}

// check loads the stream with jsm.go and the high-water mark, lists the
// drift and, with --fix, puts right what an update can.
func (c *checkCmd) check(ctx context.Context, nc *nats.Conn, bc streams.BucketConfig) (*checkReport, error) {
	name := streams.StreamName(bc.Bucket)
	rep := &checkReport{Stream: name, Drifts: []streams.Drift{}}
	mgr, err := jsm.New(nc, jsm.WithTimeout(c.Timeout))
	if err != nil {
		return nil, fmt.Errorf("jsm: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	hctx, cancel := context.WithTimeout(ctx, c.Timeout)
	rep.HighWater, err = streams.LoadHighWater(hctx, js, bc.Bucket)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("token high-water mark: %w", err)
	}
	st, err := mgr.LoadStream(name)
	if jsm.IsNatsError(err, 10059) { // stream not found
		rep.Drifts = append(rep.Drifts, streams.Drift{Setting: "stream", Want: "present (lockd creates it when it starts)", Have: "missing"})
		return rep, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load stream %s: %w", name, err)
	}
	rep.Exists = true
	info, err := st.LatestInformation()
	if err != nil {
		return nil, fmt.Errorf("stream %s info: %w", name, err)
	}
	drifts, err := rep.observe(info, bc)
	if err != nil {
		return nil, err
	}
	if c.Fix && slices.ContainsFunc(drifts, func(d streams.Drift) bool { return d.Fixable }) {
		if err := c.fix(st, bc); err != nil {
			rep.FixError = err.Error()
		} else if info, err = st.LatestInformation(); err != nil { // reloaded by the update
			return nil, fmt.Errorf("stream %s info after --fix: %w", name, err)
		} else {
			before := drifts
			if drifts, err = rep.observe(info, bc); err != nil {
				return nil, err
			}
			for _, d := range before {
				if !slices.ContainsFunc(drifts, func(r streams.Drift) bool { return r.Setting == d.Setting }) {
					rep.Fixed = append(rep.Fixed, d)
				}
			}
		}
	}
	rep.Drifts = append(rep.Drifts, drifts...)
	return rep, nil
}

// observe fills in the report's view of info and returns the drift.
func (rep *checkReport) observe(info *api.StreamInfo, bc streams.BucketConfig) ([]streams.Drift, error) {
	sc, err := toNATS(info.Config)
	if err != nil {
		return nil, err
	}
	rep.FirstSeq, rep.LastSeq, rep.Leader = info.State.FirstSeq, info.State.LastSeq, ""
	if info.Cluster != nil {
		rep.Leader = info.Cluster.Leader
	}
	rep.Warnings = nil
	if info.Cluster != nil && info.Cluster.Leader == "" {
		rep.Warnings = append(rep.Warnings, "the stream has no leader: a replica that is behind may have answered (its last sequence may be low)")
	}
	var res monitor.Result
	monitor.CheckStreamInfoHealth(info, &res, monitor.CheckStreamHealthOptions{
		StreamName: info.Config.Name, ClusterExpectedPeers: bc.Replicas, ClusterLagCritical: 10_000, ClusterSeenCritical: 10,
	}, api.NewDiscardLogger())
	for _, w := range append(res.Criticals, res.Warnings...) {
		rep.Warnings = append(rep.Warnings, "jsm stream check: "+w)
	}
	return bc.Drift(sc, info.State.LastSeq, rep.HighWater), nil
}

// fix applies streams' Fixed to the stream's configuration with jsm.go.
// A permission violation ends it at once (the update's request would
// otherwise wait for its timeout).
func (c *checkCmd) fix(st *jsm.Stream, bc streams.BucketConfig) error {
	sc, err := toNATS(st.Configuration())
	if err != nil {
		return err
	}
	fixed, err := toJSM(bc.Fixed(sc))
	if err != nil {
		return err
	}
	select {
	case <-c.denied: // an earlier request's, not the update's
	default:
	}
	done := make(chan error, 1)
	go func() { done <- st.UpdateConfiguration(fixed) }()
	select {
	case err := <-done:
		return err
	case err := <-c.denied:
		return fmt.Errorf("%w (the stream update needs the store user's rights)", err)
	}
}

// toNATS and toJSM convert between jsm.go's and nats.go's views of a stream
// configuration; both are the server's JSON, field for field.
func toNATS(c api.StreamConfig) (jetstream.StreamConfig, error) {
	var sc jetstream.StreamConfig
	return sc, convert(c, &sc)
}

func toJSM(c jetstream.StreamConfig) (api.StreamConfig, error) {
	var sc api.StreamConfig
	return sc, convert(c, &sc)
}

func convert(from, to any) error {
	b, err := json.Marshal(from)
	if err == nil {
		err = json.Unmarshal(b, to)
	}
	if err != nil {
		return fmt.Errorf("convert stream configuration: %w", err)
	}
	return nil
}

func (rep *checkReport) print(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	if !rep.Exists {
		fmt.Fprintf(w, "stream %s: missing; token high-water mark %d\n", rep.Stream, rep.HighWater)
	} else {
		leader := rep.Leader
		if leader == "" {
			leader = "none"
		}
		fmt.Fprintf(w, "stream %s: first sequence %d, last sequence %d, token high-water mark %d, leader %s\n",
			rep.Stream, rep.FirstSeq, rep.LastSeq, rep.HighWater, leader)
	}
	for _, d := range rep.Fixed {
		fmt.Fprintf(w, "fixed: %s\n", d)
	}
	for _, d := range rep.Drifts {
		how := "needs the operator"
		if d.Fixable {
			how = "lockd check --fix puts it right"
		}
		fmt.Fprintf(w, "drift: %s (%s)\n", d, how)
	}
	for _, warn := range rep.Warnings {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	if rep.FixError != "" {
		fmt.Fprintf(w, "--fix failed: %s\n", rep.FixError)
	}
	if len(rep.Drifts) == 0 {
		fmt.Fprintln(w, "no drift")
	} else {
		fmt.Fprintf(w, "%d drift(s)\n", len(rep.Drifts))
	}
	return nil
}
