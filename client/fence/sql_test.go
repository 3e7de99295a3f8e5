package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/jetlock/jetlock/client/fence"
	_ "modernc.org/sqlite"
)

// openSQLite opens a fresh SQLite database file in WAL mode; writers wait
// for each other (busy_timeout) instead of failing.
func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	dsn := "file:" + filepath.Join(t.TempDir(), "fence.db") +
		"?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(8)
	return db
}

func newSQLGuard(t *testing.T, db *sql.DB) *fence.SQL {
	t.Helper()
	g, err := fence.NewSQL(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	return g
}

func TestSQL(t *testing.T) {
	runGuardSuite(t, func(t *testing.T) fence.Guard { return newSQLGuard(t, openSQLite(t)) },
		concurrency{goroutines: 8, ops: 40, maxToken: 8})
}

func TestSQLOptions(t *testing.T) {
	for _, name := range []string{"", "1abc", "a-b", "a;drop table x", "a.b.c", `"q"`} {
		if _, err := fence.NewSQL(nil, fence.SQLTable(name)); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("SQLTable(%q): err = %v, want ErrInvalid", name, err)
		}
	}
	g, err := fence.NewSQL(nil, fence.SQLTable("main.my_fence"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "CREATE TABLE IF NOT EXISTS main.my_fence (resource TEXT PRIMARY KEY, token BIGINT NOT NULL)"; g.Schema() != want {
		t.Errorf("Schema() = %q, want %q", g.Schema(), want)
	}
	if err := g.Check(context.Background(), "r", 1); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("Check without a DB = %v, want ErrInvalid", err)
	}
	db := openSQLite(t)
	g = newSQLGuard(t, db)
	if err := g.Check(context.Background(), "r", math.MaxInt64+1); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("Check with a token above MaxInt64 = %v, want ErrInvalid", err)
	}
	if err := g.Check(context.Background(), "r", math.MaxInt64); err != nil {
		t.Errorf("Check with MaxInt64 = %v", err)
	}
}

// TestSQLWriteIsAtomic: the fence and the protected write commit together;
// a stale token or a failing write leaves both unchanged.
func TestSQLWriteIsAtomic(t *testing.T) {
	ctx := context.Background()
	db := openSQLite(t)
	g := newSQLGuard(t, db)
	mustExec(t, db, "CREATE TABLE backups (user_id TEXT PRIMARY KEY, state TEXT NOT NULL)")
	setState := func(token uint64, state string) error {
		return g.Write(ctx, "lock:backup:user123", token, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO backups (user_id, state) VALUES ($1, $2) "+
				"ON CONFLICT (user_id) DO UPDATE SET state = excluded.state", "user123", state)
			return err
		})
	}
	if err := setState(5, "A"); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := g.Write(ctx, "lock:backup:user123", 8, func(tx *sql.Tx) error { return boom })
	if err != boom {
		t.Fatalf("Write with failing fn = %v, want fn's error", err)
	}
	if h, _ := g.Highest(ctx, "lock:backup:user123"); h != 5 {
		t.Fatalf("after a rolled-back write Highest = %d, want 5", h)
	}
	if err := setState(7, "B"); err != nil {
		t.Fatal(err)
	}
	called := false
	err = g.Write(ctx, "lock:backup:user123", 5, func(*sql.Tx) error { called = true; return nil })
	var se *fence.StaleTokenError
	if !errors.As(err, &se) || se.Highest != 7 || called {
		t.Fatalf("stale Write = %v (fn called: %v), want StaleTokenError with highest 7 and fn not called", err, called)
	}
	if got := queryString(t, db, "SELECT state FROM backups WHERE user_id = 'user123'"); got != "B" {
		t.Fatalf("state = %q, want B", got)
	}
}

// TestSQLDelayedOldWrite: A's transaction began before B's token was
// accepted, but its fenced write reaches the database after B committed.
func TestSQLDelayedOldWrite(t *testing.T) {
	ctx := context.Background()
	db := openSQLite(t)
	g := newSQLGuard(t, db)
	mustExec(t, db, "CREATE TABLE docs (id TEXT PRIMARY KEY, body TEXT NOT NULL)")
	put := func(tx *sql.Tx, body string) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO docs (id, body) VALUES ('d', $1) "+
			"ON CONFLICT (id) DO UPDATE SET body = excluded.body", body)
		return err
	}
	const t1, t2 = 100, 200
	if err := g.Write(ctx, "docs/d", t1, func(tx *sql.Tx) error { return put(tx, "A first") }); err != nil {
		t.Fatal(err)
	}
	txA, err := db.BeginTx(ctx, nil) // A starts its write with t1 ...
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback()
	// ... B acquires t2 and writes meanwhile ...
	if err := g.Write(ctx, "docs/d", t2, func(tx *sql.Tx) error { return put(tx, "B") }); err != nil {
		t.Fatalf("B's write = %v", err)
	}
	// ... and A's statements arrive.
	if err := g.CheckTx(ctx, txA, "docs/d", t1); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("A's delayed CheckTx = %v, want ErrStaleToken", err)
	}
	txA.Rollback()
	if got := queryString(t, db, "SELECT body FROM docs WHERE id = 'd'"); got != "B" {
		t.Fatalf("body = %q, want B", got)
	}
}

// TestSQLFenceColumnPattern is the pattern without a fence table: the
// fence is a column of the protected row and part of the same UPDATE.
func TestSQLFenceColumnPattern(t *testing.T) {
	ctx := context.Background()
	db := openSQLite(t)
	mustExec(t, db, "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, fence BIGINT NOT NULL DEFAULT 0)")
	mustExec(t, db, "INSERT INTO accounts (id, balance) VALUES (42, 0)")
	setBalance := func(token int64, balance int) int64 {
		res, err := db.ExecContext(ctx,
			"UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2", balance, token, 42)
		if err != nil {
			t.Fatal(err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, c := range []struct {
		token   int64
		balance int
		rows    int64
	}{{5, 100, 1}, {5, 110, 1}, {9, 200, 1}, {7, 999, 0}, {9, 210, 1}} {
		if n := setBalance(c.token, c.balance); n != c.rows {
			t.Fatalf("UPDATE with token %d changed %d rows, want %d", c.token, n, c.rows)
		}
	}
	if got := queryString(t, db, "SELECT balance FROM accounts WHERE id = 42"); got != "210" {
		t.Fatalf("balance = %s, want 210", got)
	}
}

// TestSQLConcurrentOrderLog: writers on several connections append to a
// log table inside their fenced transaction; the log's row ids are the
// commit order, and tokens along it never go down.
func TestSQLConcurrentOrderLog(t *testing.T) {
	ctx := context.Background()
	db := openSQLite(t)
	g := newSQLGuard(t, db)
	mustExec(t, db, "CREATE TABLE log (seq INTEGER PRIMARY KEY AUTOINCREMENT, resource TEXT NOT NULL, token BIGINT NOT NULL)")
	resources := []string{"a", "b"}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 40 {
				res, tok := resources[rand.IntN(len(resources))], 1+uint64(j)+rand.Uint64N(8)
				err := g.Write(ctx, res, tok, func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, "INSERT INTO log (resource, token) VALUES ($1, $2)", res, int64(tok))
					return err
				})
				if err != nil && !errors.Is(err, fence.ErrStaleToken) {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, res := range resources {
		rows, err := db.QueryContext(ctx, "SELECT token FROM log WHERE resource = $1 ORDER BY seq", res)
		if err != nil {
			t.Fatal(err)
		}
		var tokens []uint64
		for rows.Next() {
			var tok uint64
			if err := rows.Scan(&tok); err != nil {
				t.Fatal(err)
			}
			tokens = append(tokens, tok)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		checkOrderLog(t, res, tokens)
	}
}

func mustExec(t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func queryString(t *testing.T, db *sql.DB, q string) string {
	t.Helper()
	var s string
	if err := db.QueryRowContext(context.Background(), q).Scan(&s); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return s
}

// CheckTx takes a transaction and nothing that autocommits: with a *sql.DB
// the check would commit by itself and the protected write after it would
// go unfenced. The type says so; a nil transaction is refused and changes
// nothing.
func TestSQLCheckTxNeedsATransaction(t *testing.T) {
	if got, want := reflect.TypeOf((*fence.SQL).CheckTx).In(2), reflect.TypeOf((*sql.Tx)(nil)); got != want {
		t.Fatalf("CheckTx takes %v, want %v (a handle that autocommits would split the check from the write)", got, want)
	}
	ctx := context.Background()
	db := openSQLite(t)
	g := newSQLGuard(t, db)
	if err := g.CheckTx(ctx, nil, "docs/d", 7); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("CheckTx with a nil transaction = %v, want ErrInvalid", err)
	}
	if h, err := g.Highest(ctx, "docs/d"); err != nil || h != 0 {
		t.Fatalf("after a refused CheckTx the fence reads %d, %v; want 0", h, err)
	}
}
