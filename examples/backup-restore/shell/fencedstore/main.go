// Command fencedstore is the shell example's store: keys and values in an
// SQLite file, every write fenced by a jetlock token with fence.SQL (the
// resource's highest accepted token is checked and raised in the same
// transaction as the write), so that several processes can share it.
//
//	fencedstore -db store.db init KEY=VALUE...
//	fencedstore -db store.db get KEY
//	fencedstore -db store.db write RESOURCE TOKEN KEY=VALUE...
//	fencedstore -db store.db highest RESOURCE
//
// write exits 3, printing REJECTED, when TOKEN is smaller than one the
// store has accepted for RESOURCE; nothing is written then.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

	"github.com/jetlock/jetlock/client/fence"
)

// exitStale is write's exit code for a stale token.
const exitStale = 3

func main() {
	dbPath := flag.String("db", "store.db", "SQLite file of the store")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: fencedstore -db FILE init KEY=VALUE... | get KEY | write RESOURCE TOKEN KEY=VALUE... | highest RESOURCE")
	}
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, err := run(ctx, *dbPath, flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "fencedstore:", err)
	}
	os.Exit(code)
}

func run(ctx context.Context, path string, args []string) (int, error) {
	if len(args) == 0 {
		flag.Usage()
		return 2, nil
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		return 1, err
	}
	defer db.Close()
	guard, err := fence.NewSQL(db)
	if err != nil {
		return 1, err
	}
	switch cmd, rest := args[0], args[1:]; {
	case cmd == "init":
		if err := guard.CreateTable(ctx); err != nil {
			return 1, err
		}
		if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT NOT NULL)`); err != nil {
			return 1, err
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return 1, err
		}
		defer tx.Rollback() //nolint:errcheck // after Commit, a no-op
		if err := put(ctx, tx, rest); err != nil {
			return 2, err
		}
		return 0, tx.Commit()
	case cmd == "get" && len(rest) == 1:
		var v string
		if err := db.QueryRowContext(ctx, `SELECT v FROM kv WHERE k = $1`, rest[0]).Scan(&v); err != nil {
			return 1, fmt.Errorf("get %s: %w", rest[0], err)
		}
		fmt.Println(v)
		return 0, nil
	case cmd == "highest" && len(rest) == 1:
		h, err := guard.Highest(ctx, rest[0])
		if err != nil {
			return 1, err
		}
		fmt.Println(h)
		return 0, nil
	case cmd == "write" && len(rest) >= 3:
		token, err := strconv.ParseUint(rest[1], 10, 64)
		if err != nil {
			return 2, fmt.Errorf("token %q: %w", rest[1], err)
		}
		err = guard.Write(ctx, rest[0], token, func(tx *sql.Tx) error { return put(ctx, tx, rest[2:]) })
		var stale *fence.StaleTokenError
		if errors.As(err, &stale) {
			fmt.Printf("REJECTED: token %d is stale for %s, token %d was already accepted\n", stale.Token, rest[0], stale.Highest)
			return exitStale, nil
		}
		if err != nil {
			return 1, err
		}
		fmt.Printf("accepted: token %d for %s\n", token, rest[0])
		return 0, nil
	}
	flag.Usage()
	return 2, nil
}

// put writes KEY=VALUE pairs in tx.
func put(ctx context.Context, tx *sql.Tx, pairs []string) error {
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q is not KEY=VALUE", p)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO kv (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v`, k, v); err != nil {
			return err
		}
	}
	return nil
}
