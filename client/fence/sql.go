package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sync/atomic"
)

// DefaultSQLTable is the default name of the fence table.
const DefaultSQLTable = "jetlock_fence"

// SQLOption configures NewSQL.
type SQLOption func(*sqlOptions) error

type sqlOptions struct {
	table string
}

var sqlTableRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

// SQLTable sets the fence table's name, optionally schema-qualified
// ("app.fence"). The default is "jetlock_fence". A name that is not one or
// two dot-separated identifiers of letters, digits and '_' is an error
// wrapping ErrInvalid (it is written into the SQL text, never quoted).
func SQLTable(name string) SQLOption {
	return func(o *sqlOptions) error {
		if !sqlTableRe.MatchString(name) {
			return invalidf("SQL table name %q is not an identifier", name)
		}
		o.table = name
		return nil
	}
}

// queryer reads the fence row: *sql.Tx and *sql.DB have these methods.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// SQL is a Guard that keeps the highest accepted token per resource in a
// table of a SQL database, so that the fence check and the protected write
// commit in one transaction. Its statements use "$1" placeholders and
// INSERT … ON CONFLICT, which PostgreSQL (9.5+), CockroachDB and SQLite
// (3.24+, e.g. modernc.org/sqlite) understand. The table (see Schema) is
//
//	CREATE TABLE IF NOT EXISTS jetlock_fence (
//		resource TEXT PRIMARY KEY,
//		token    BIGINT NOT NULL
//	)
//
// and one check is the single statement
//
//	INSERT INTO jetlock_fence AS f (resource, token) VALUES ($1, $2)
//	ON CONFLICT (resource) DO UPDATE SET token = excluded.token
//	WHERE f.token <= excluded.token
//
// which changes one row if the token is accepted and none if it is stale.
// The updated row stays locked until the transaction ends, so no other
// writer of the resource can commit in between. Tokens are stored as
// BIGINT: a token above math.MaxInt64 is refused with ErrInvalid (jetlock's
// tokens are KV revisions and never get near it).
//
// When the protected data has its own row, the same idea needs no extra
// table: keep a fence column on that row and make it part of the write,
//
//	UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2
//
// then treat "0 rows affected" as a stale token (or a missing row).
//
// Methods are safe for concurrent use as far as the *sql.DB is.
type SQL struct {
	db       *sql.DB
	table    string
	upsert   string
	selectQ  string
	rejected atomic.Uint64
}

// NewSQL returns a guard on db. db may be nil if only CheckTx is used. It
// returns an error wrapping ErrInvalid for an invalid option. It does no
// I/O; call CreateTable (or run Schema in your migrations) first.
func NewSQL(db *sql.DB, opts ...SQLOption) (*SQL, error) {
	o := sqlOptions{table: DefaultSQLTable}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	return &SQL{
		db:    db,
		table: o.table,
		upsert: "INSERT INTO " + o.table + " AS f (resource, token) VALUES ($1, $2) " +
			"ON CONFLICT (resource) DO UPDATE SET token = excluded.token WHERE f.token <= excluded.token",
		selectQ: "SELECT token FROM " + o.table + " WHERE resource = $1",
	}, nil
}

// Schema returns the CREATE TABLE statement of the fence table.
func (s *SQL) Schema() string {
	return "CREATE TABLE IF NOT EXISTS " + s.table + " (resource TEXT PRIMARY KEY, token BIGINT NOT NULL)"
}

// CreateTable creates the fence table if it does not exist.
func (s *SQL) CreateTable(ctx context.Context) error {
	if s.db == nil {
		return invalidf("no *sql.DB given to NewSQL")
	}
	if _, err := s.db.ExecContext(ctx, s.Schema()); err != nil {
		return fmt.Errorf("fence: create table %s: %w", s.table, err)
	}
	return nil
}

// CheckTx checks token inside the caller's transaction tx: run it before
// the protected statements and commit them together; if it returns an
// error, roll back. It takes a *sql.Tx, not a *sql.DB or *sql.Conn: on a
// handle that autocommits, the check would commit on its own and the
// protected write after it would be unfenced. A nil tx is an error
// wrapping ErrInvalid. An accepted token is recorded only when tx commits, and
// the fence row stays locked until then, so fenced writers of one resource
// are serialized. On SQLite make CheckTx the first statement of the
// transaction (or begin IMMEDIATE), so the transaction does not read an
// older snapshot before it takes the write lock.
//
// Errors are those of Guard.Check, plus an error wrapping ErrInvalid for a
// token above math.MaxInt64 and driver errors wrapped as they come.
func (s *SQL) CheckTx(ctx context.Context, tx *sql.Tx, resource string, token uint64) error {
	if tx == nil {
		return invalidf("CheckTx needs a transaction (*sql.Tx), got nil")
	}
	if err := validate(resource, token); err != nil {
		return err
	}
	if token > math.MaxInt64 {
		return invalidf("token %d does not fit a BIGINT column", token)
	}
	res, err := tx.ExecContext(ctx, s.upsert, resource, int64(token))
	if err != nil {
		return s.storeErr(ctx, "fence check", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("fence: rows affected: %w", err)
	}
	if n == 1 {
		return nil
	}
	if n != 0 {
		return fmt.Errorf("fence: fence check changed %d rows of %s, want 0 or 1: is resource its primary key?", n, s.table)
	}
	highest, err := s.highest(ctx, tx, resource)
	if err != nil {
		return err
	}
	s.rejected.Add(1)
	return &StaleTokenError{Resource: resource, Token: token, Highest: highest}
}

// Write runs fn in a new transaction after checking token in it (CheckTx)
// and commits if fn returns nil; otherwise it rolls back and returns the
// error of CheckTx or fn unchanged (fn is not called after a rejection).
// This is the one-call form of the fenced write:
//
//	err := guard.Write(ctx, "orders/123", lease.Token(), func(tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, "UPDATE orders SET state = $1 WHERE id = $2", "paid", 123)
//		return err
//	})
//	if errors.Is(err, fence.ErrStaleToken) {
//		// Our lease was lost; someone newer owns orders/123.
//	}
//
// A commit error is returned wrapped; the outcome is then unknown.
func (s *SQL) Write(ctx context.Context, resource string, token uint64, fn func(tx *sql.Tx) error) error {
	if s.db == nil {
		return invalidf("no *sql.DB given to NewSQL")
	}
	if err := validate(resource, token); err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.storeErr(ctx, "begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := s.CheckTx(ctx, tx, resource, token); err != nil {
		return err
	}
	if fn != nil {
		if err := fn(tx); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return s.storeErr(ctx, "commit", err)
	}
	return nil
}

// Check implements Guard with CheckTx in a transaction of its own, for a
// resource that is not in this database. Prefer Write or CheckTx when it
// is.
func (s *SQL) Check(ctx context.Context, resource string, token uint64) error {
	return s.Write(ctx, resource, token, nil)
}

// Highest implements Guard.
func (s *SQL) Highest(ctx context.Context, resource string) (uint64, error) {
	if s.db == nil {
		return 0, invalidf("no *sql.DB given to NewSQL")
	}
	return s.highest(ctx, s.db, resource)
}

func (s *SQL) highest(ctx context.Context, q queryer, resource string) (uint64, error) {
	var h int64
	err := q.QueryRowContext(ctx, s.selectQ, resource).Scan(&h)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, s.storeErr(ctx, "read fence", err)
	}
	return uint64(h), nil
}

// Rejected implements Guard. It counts the rejections of this SQL value,
// including those in transactions that were later rolled back.
func (s *SQL) Rejected() uint64 { return s.rejected.Load() }

func (s *SQL) storeErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("fence: %s on %s: %w", what, s.table, err)
}
