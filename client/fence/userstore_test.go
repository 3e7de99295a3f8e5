package fence_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/client/fence"
)

// The fenced store of the end-to-end tests, its wire format, and the
// network link that lets a test pause one holder.

// storeSubject is where userStore serves fenced writes.
const storeSubject = "test.userstore.write"

// Backends of userStore, in the order the tests use them.
var backends = []string{"memory", "kv", "sql"}

// storeWrite asks userStore to write Data for Resource with Token, through
// one backend.
type storeWrite struct {
	Backend  string `json:"backend"`
	Resource string `json:"resource"`
	Token    uint64 `json:"token"`
	Data     string `json:"data"`
}

// storeReply is userStore's answer. Arrival numbers the requests in the
// order the store received them, from 1.
type storeReply struct {
	Arrival  int    `json:"arrival"`
	Accepted bool   `json:"accepted"`
	Stale    bool   `json:"stale,omitempty"`
	Highest  uint64 `json:"highest,omitempty"` // with Stale: the token that made it stale
	Err      string `json:"err,omitempty"`
}

// userStore is the protected resource of the end-to-end tests: a storage
// service that keeps one value per resource in three stores, each behind
// its own fence guard — process memory, a JetStream KV bucket on the
// cluster (the value lives in the guard record, KV.Put) and an SQLite
// database (SQL.Write) — and serves fenced writes over NATS, one at a
// time in arrival order, as a remote resource would. The check happens
// when a request arrives, so a request that was delayed on its way is
// judged against the tokens accepted by then.
type userStore struct {
	mem *fence.Memory
	kv  *fence.KV
	sql *fence.SQL
	db  *sql.DB

	// bucket holds the KV guard records.
	bucket string

	mu      sync.Mutex
	memData map[string]string // written inside mem.Do
	arrived int               // requests received so far
}

// startUserStore starts a userStore serving on nc, with a fresh R3 bucket
// and a fresh SQLite database. It stops at cleanup.
func startUserStore(t *testing.T, nc *nats.Conn) *userStore {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv := newBucket(t, js)
	db := openSQLite(t)
	s := &userStore{
		mem:     fence.NewMemory(),
		kv:      newKVGuard(t, kv),
		sql:     newSQLGuard(t, db),
		db:      db,
		bucket:  kv.Bucket(),
		memData: map[string]string{},
	}
	if _, err := db.Exec(`CREATE TABLE user_data (resource TEXT PRIMARY KEY, data TEXT NOT NULL, token BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	sub, err := nc.Subscribe(storeSubject, s.serve)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return s
}

// serve handles one write request. NATS calls it for one message at a
// time, so the arrival numbers follow the store's processing order.
func (s *userStore) serve(m *nats.Msg) {
	s.mu.Lock()
	s.arrived++
	reply := storeReply{Arrival: s.arrived}
	s.mu.Unlock()

	var req storeWrite
	err := json.Unmarshal(m.Data, &req)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = s.write(ctx, req)
		cancel()
	}
	var se *fence.StaleTokenError
	switch {
	case err == nil:
		reply.Accepted = true
	case errors.As(err, &se):
		reply.Stale, reply.Highest, reply.Err = true, se.Highest, err.Error()
	default:
		reply.Err = err.Error()
	}
	data, _ := json.Marshal(reply)
	_ = m.Respond(data)
}

// write makes the check and the write one atomic step in each backend.
func (s *userStore) write(ctx context.Context, req storeWrite) error {
	switch req.Backend {
	case "memory":
		return s.mem.Do(ctx, req.Resource, req.Token, func() error {
			s.mu.Lock()
			s.memData[req.Resource] = req.Data
			s.mu.Unlock()
			return nil
		})
	case "kv":
		_, err := s.kv.Put(ctx, req.Resource, req.Token, []byte(req.Data))
		return err
	case "sql":
		return s.sql.Write(ctx, req.Resource, req.Token, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO user_data (resource, data, token) VALUES ($1, $2, $3)
				ON CONFLICT (resource) DO UPDATE SET data = excluded.data, token = excluded.token`,
				req.Resource, req.Data, int64(req.Token))
			return err
		})
	}
	return fmt.Errorf("unknown backend %q", req.Backend)
}

// guard returns the guard of backend.
func (s *userStore) guard(backend string) fence.Guard {
	switch backend {
	case "memory":
		return s.mem
	case "kv":
		return s.kv
	default:
		return s.sql
	}
}

// read returns the value stored for resource by backend and, for KV, the
// guard record's revision. A KV read may come from a lagging replica.
func (s *userStore) read(ctx context.Context, backend, resource string) (data string, rev uint64, err error) {
	switch backend {
	case "memory":
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.memData[resource], 0, nil
	case "kv":
		e, err := s.kv.Get(ctx, resource)
		return string(e.Value), e.Revision, err
	default:
		err := s.db.QueryRowContext(ctx, `SELECT data FROM user_data WHERE resource = $1`, resource).Scan(&data)
		return data, 0, err
	}
}

// storeRequest sends w to the store on nc and waits for its reply.
func storeRequest(ctx context.Context, t *testing.T, nc *nats.Conn, w storeWrite) storeReply {
	t.Helper()
	data, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := nc.RequestWithContext(ctx, storeSubject, data)
	if err != nil {
		t.Fatalf("%s write with token %d: %v", w.Backend, w.Token, err)
	}
	return decodeReply(t, msg)
}

func decodeReply(t *testing.T, msg *nats.Msg) storeReply {
	t.Helper()
	var r storeReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		t.Fatalf("bad store reply %q: %v", msg.Data, err)
	}
	return r
}
