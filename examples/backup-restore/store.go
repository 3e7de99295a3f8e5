package main

import (
	"context"
	"database/sql"
	"fmt"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

	"github.com/jetlock/jetlock/client/fence"
)

// userStore is the user data that both services change: each user's
// content and the id of their latest backup, plus the backup snapshots,
// in one SQLite database. Every change is a fenced write: the fence row of
// the user's lock resource is checked and updated in the same transaction
// as the change (fence.SQL.Write), so a write with a token older than one
// already accepted changes nothing.
type userStore struct {
	db    *sql.DB
	guard *fence.SQL
}

const schema = `
CREATE TABLE users (
	user_id       TEXT PRIMARY KEY,
	content       TEXT NOT NULL,
	latest_backup TEXT NOT NULL
);
CREATE TABLE snapshots (
	id      TEXT PRIMARY KEY,
	user_id TEXT NOT NULL,
	content TEXT NOT NULL
);`

// openStore creates the database at path with the fence table and the
// example's starting data: user123's content is "photos v2", and their
// latest backup, backup-1, holds "photos v1".
func openStore(ctx context.Context, path string) (*userStore, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		return nil, err
	}
	guard, err := fence.NewSQL(db)
	if err != nil {
		db.Close()
		return nil, err
	}
	s := &userStore{db: db, guard: guard}
	if err := s.init(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

func (s *userStore) init(ctx context.Context) error {
	if err := s.guard.CreateTable(ctx); err != nil {
		return err
	}
	for _, q := range []string{
		schema,
		`INSERT INTO snapshots (id, user_id, content) VALUES ('backup-1', 'user123', 'photos v1')`,
		`INSERT INTO users (user_id, content, latest_backup) VALUES ('user123', 'photos v2', 'backup-1')`,
	} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("set up the store: %w", err)
		}
	}
	return nil
}

// Close closes the database.
func (s *userStore) Close() error { return s.db.Close() }

// User returns user's content and latest backup id. Reads need no token.
func (s *userStore) User(ctx context.Context, user string) (content, latestBackup string, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT content, latest_backup FROM users WHERE user_id = $1`, user).
		Scan(&content, &latestBackup)
	return content, latestBackup, err
}

// RecordBackup stores content as snapshot id and makes it user's latest
// backup, if token is not stale for the user's lock resource. A stale
// token returns a *fence.StaleTokenError and changes nothing.
func (s *userStore) RecordBackup(ctx context.Context, token uint64, user, id, content string) error {
	return s.guard.Write(ctx, lockResource(user), token, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO snapshots (id, user_id, content) VALUES ($1, $2, $3)`, id, user, content); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE users SET latest_backup = $1 WHERE user_id = $2`, id, user)
		return err
	})
}

// Restore replaces user's content with snapshot id's, if token is not
// stale for the user's lock resource, and returns the restored content.
func (s *userStore) Restore(ctx context.Context, token uint64, user, id string) (string, error) {
	var content string
	err := s.guard.Write(ctx, lockResource(user), token, func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, `SELECT content FROM snapshots WHERE id = $1 AND user_id = $2`, id, user).Scan(&content); err != nil {
			return fmt.Errorf("snapshot %s: %w", id, err)
		}
		_, err := tx.ExecContext(ctx, `UPDATE users SET content = $1, latest_backup = $2 WHERE user_id = $3`, content, id, user)
		return err
	})
	return content, err
}
