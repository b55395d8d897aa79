// Package pgha drives the Postgres primary and streaming replica, and the
// PgBouncer in front of them, that hack/postgres-ha.sh runs beside the
// system cluster, for the suites that inject database faults: their URLs,
// the script's subcommands, and a pool that follows the primary.
package pgha

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spillway-io/spillway/test/testenv"
)

// Script runs hack/postgres-ha.sh with args, and returns its output's last
// line: each subcommand's result.
func Script(args ...string) (string, error) {
	cmd := exec.Command("hack/postgres-ha.sh", args...)
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("hack/postgres-ha.sh %s: %w: %s", strings.Join(args, " "), err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

// Missing says why the primary, the replica or PgBouncer cannot run here,
// or is empty: a suite skips its specs then, unless CI=true, where a
// missing piece fails the run.
func Missing() string {
	if missing := MissingServers(); missing != "" {
		return missing
	}
	if _, err := exec.LookPath("pgbouncer"); err != nil {
		if _, err := os.Stat("/usr/sbin/pgbouncer"); err != nil {
			return "PgBouncer is not installed: the pooler specs start one (apt-get install pgbouncer; make test installs it)"
		}
	}
	return ""
}

// MissingServers says why the primary and the replica cannot run here, or
// is empty.
func MissingServers() string {
	if _, err := exec.LookPath("pg_createcluster"); err != nil {
		return "postgresql-common is not installed: the database fault specs create a primary and a replica with pg_createcluster"
	}
	if _, err := os.Stat("/usr/lib/postgresql/15/bin/pg_basebackup"); err != nil {
		return "PostgreSQL 15 is not installed: the database fault specs need its server binaries"
	}
	return ""
}

// InCI reports whether a missing piece must fail the run.
func InCI() bool { return os.Getenv("CI") == "true" }

// Ports of the two nodes and of PgBouncer.
const (
	PortA       = 5433
	PortB       = 5434
	PortBouncer = 6435
)

// Addrs are the nodes' and PgBouncer's addresses, which a local cluster's
// pods need forwarded.
func Addrs() []string {
	return []string{fmt.Sprintf("127.0.0.1:%d", PortA), fmt.Sprintf("127.0.0.1:%d", PortB), fmt.Sprintf("127.0.0.1:%d", PortBouncer)}
}

// URL lists both nodes for user, asking for the one that takes writes: a
// client following the primary through a failover.
func URL(user string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/test?sslmode=disable&target_session_attrs=read-write", user, PortA, PortB)
}

// Pooled is PgBouncer's database in transaction mode (test_tx) or in
// session mode (test_session), both the primary's test.
func Pooled(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", PortBouncer, database)
}

// Pool opens a pool on url, as an application following the primary does:
// each session taken from it is checked again as the URL's
// target_session_attrs asks, so that one left on a demoted primary is
// replaced.
func Pool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if validate := cfg.ConnConfig.ValidateConnect; validate != nil {
		cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
			return validate(ctx, c.PgConn()) == nil, nil
		}
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// SessionState lists what Spillway's sessions of user on db's server hold
// that a transaction pooler would strand or lose: their LISTENs and their
// advisory locks. The application's sessions are left out: the notify
// trigger takes a transaction's advisory lock in each of its inserts.
func SessionState(ctx context.Context, db *pgxpool.Pool, user string) ([]string, error) {
	rows, err := db.Query(ctx, `
		SELECT query FROM pg_stat_activity WHERE usename = $1 AND query LIKE 'LISTEN%'
		UNION ALL
		SELECT 'advisory lock ' || l.objid || ' held by ' || a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND a.usename = $1 AND a.application_name LIKE 'spillway-%'`, user)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
