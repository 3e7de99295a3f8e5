package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/jetlock/jetlock/internal/handover"
	"github.com/jetlock/jetlock/streams"
)

// handoverCmd is `lockd handover`: the pre-stop step of a NATS server
// (deploy/'s units and manifests run it before lame duck mode). When the
// server leads the bucket's stream, the leadership goes to the replica
// that is most current before the server stops, instead of to whichever
// peer the server's own step-down picks.
type handoverCmd struct {
	storeAccess `embed:""`
	Bucket      string `help:"KV bucket holding lock state." default:"jetlock" env:"JETLOCK_BUCKET"`

	From    string        `help:"Name of the NATS server about to stop (its server_name)." placeholder:"NAME" xor:"from"`
	Local   string        `help:"Monitoring URL of the NATS server about to stop, whose /varz names it (for a pre-stop step on the server's own host)." placeholder:"URL" xor:"from"`
	JSON    bool          `help:"Print one JSON document: server, stream, leader, new_leader, took_ns." name:"json"`
	Timeout time.Duration `help:"Bound on the whole hand-over." default:"10s" env:"JETLOCK_HANDOVER_TIMEOUT"`
}

func (c *handoverCmd) Run(ctx context.Context, out *stdio) error {
	bc := streams.BucketConfig{Bucket: c.Bucket}
	if err := bc.Validate(); err != nil {
		return usageError("%v", err)
	}
	if c.Timeout <= 0 {
		return usageError("--timeout must be positive")
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	from := c.From
	if c.Local != "" {
		name, err := serverName(ctx, c.Local)
		if err != nil {
			return usageError("--local %s: %v", c.Local, err)
		}
		from = name
	}
	if from == "" {
		return usageError("name the server about to stop: --from NAME or --local URL")
	}
	nc, err := c.connect("jetlock-lockd-handover", c.Timeout)
	if err != nil {
		return err
	}
	defer nc.Close()
	stream := streams.StreamName(bc.Bucket)
	res, err := handover.Move(ctx, nc, stream, from)
	select {
	case denied := <-c.denied:
		err = fmt.Errorf("%w (the store user needs stream info and leader step-down on %s)", denied, stream)
	default:
	}
	if err != nil {
		return &exitError{code: exitFailed, err: fmt.Errorf("hand %s over from %s: %w", stream, from, err)}
	}
	return printHandover(out.out, c.JSON, from, stream, res)
}

// printHandover reports what Move did.
func printHandover(w io.Writer, asJSON bool, from, stream string, res handover.Result) error {
	if asJSON {
		return json.NewEncoder(w).Encode(struct {
			Server string `json:"server"`
			Stream string `json:"stream"`
			handover.Result
		}{from, stream, res})
	}
	var err error
	if res.NewLeader == "" {
		_, err = fmt.Fprintf(w, "%s does not lead %s (%s does): nothing to hand over\n", from, stream, orNone(res.Leader))
	} else {
		_, err = fmt.Fprintf(w, "%s handed %s over to %s in %v\n", from, stream, res.NewLeader, res.Took.Round(time.Millisecond))
	}
	return err
}

func orNone(s string) string {
	if s == "" {
		return "no server"
	}
	return s
}

// serverName reads the server_name of the NATS server whose monitoring
// endpoint is at url.
func serverName(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/varz", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("/varz answered %s", resp.Status)
	}
	var v struct {
		Name string `json:"server_name"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&v); err != nil {
		return "", fmt.Errorf("/varz: %w", err)
	}
	if v.Name == "" {
		return "", errors.New("/varz names no server")
	}
	return v.Name, nil
}
