package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/spillway-io/spillway/secret"
)

// The operator's reads and changes of outboxes: each in a transaction whose
// statements the server stops at a timeout, through the fleet's own
// Secret. Every error they return is free of the URL's password.

// InvalidURLError is a database URL that is no Postgres connection string.
// It says which, never the URL: parse errors can quote it, password
// included.
type InvalidURLError struct{}

func (InvalidURLError) Error() string { return "not a valid Postgres connection string" }

// ConnectError is a database that could not be reached, or did not answer
// within the timeout.
type ConnectError struct{ Err error }

func (e *ConnectError) Error() string { return e.Err.Error() }
func (e *ConnectError) Unwrap() error { return e.Err }

// Reader reads outboxes for the operator: one small pool per database URL,
// so that a read reuses a connection instead of opening one every status
// interval, and fleets on one database share it.
type Reader struct {
	timeout time.Duration
	mu      sync.Mutex
	byURL   map[string]*pooled
}

type pooled struct {
	*pgxpool.Pool
	lastUsed time.Time
}

// NewReader returns a Reader whose connects, reads and statements each give
// up after timeout.
func NewReader(timeout time.Duration) *Reader {
	return &Reader{timeout: timeout, byURL: map[string]*pooled{}}
}

// maxConnsPerDatabase bounds the operator's sessions on one database: its
// reads are few and short, and it is the application's database.
const maxConnsPerDatabase = 2

// pool returns the URL's pool, opening it on first use. Opening connects
// nothing: the first read does.
func (r *Reader) pool(url string) (*pgxpool.Pool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pool, ok := r.byURL[url]; ok {
		pool.lastUsed = time.Now()
		return pool.Pool, nil
	}
	cfg, err := operatorPoolConfig(url, r.timeout)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConnsPerDatabase
	// A connection idle for longer than a few status intervals is closed,
	// so the operator holds no session on a database it rarely reads.
	cfg.MaxConnIdleTime = 2 * time.Minute
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, InvalidURLError{}
	}
	r.byURL[url] = &pooled{Pool: pool, lastUsed: time.Now()}
	return pool, nil
}

// operatorPoolConfig is how the operator connects to an outbox's database:
// named in pg_stat_activity, opening no connection before it is asked for
// one, and giving up on a connect after timeout.
func operatorPoolConfig(url string, timeout time.Duration) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, InvalidURLError{}
	}
	cfg.MinConns = 0
	cfg.ConnConfig.ConnectTimeout = timeout
	cfg.ConnConfig.RuntimeParams["application_name"] = "spillway-operator"
	// Unnamed statements pass through any pooler, and whether a fleet's URL
	// names one in transaction mode is not the operator's to know; its
	// reads are too rare for prepared statements to save anything.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	// A pooled session may outlive its server's role: a primary demoted in
	// a switchover keeps its sessions and answers read-only. Checked again
	// at each acquire as the URL's target_session_attrs asks, a stale one is
	// dropped, and the next connect finds the primary.
	if validate := cfg.ConnConfig.ValidateConnect; validate != nil {
		cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
			return validate(ctx, c.PgConn()) == nil, nil
		}
	}
	return cfg, nil
}

// CloseUnused closes the pools whose URL is not in used, unless a read took
// one so recently that it may not have recorded its URL yet.
func (r *Reader) CloseUnused(used map[string]bool) {
	r.mu.Lock()
	var unused []*pooled
	for url, pool := range r.byURL {
		if !used[url] && (used == nil || time.Since(pool.lastUsed) > 2*r.timeout) {
			unused = append(unused, pool)
			delete(r.byURL, url)
		}
	}
	r.mu.Unlock()
	for _, pool := range unused {
		// Close waits for connections in use; a read holding one ends
		// within the timeout.
		go pool.Close()
	}
}

// Close closes every pool.
func (r *Reader) Close() { r.CloseUnused(nil) }

// HealthRead is what to read of one outbox.
type HealthRead struct {
	Spec        TableSpec
	MaxAttempts int
	// CountLimit is how many pending rows the read counts at most.
	CountLimit int
	// BlockedKeys also counts the keys a failure holds back.
	BlockedKeys bool
	// Secrets are scrubbed from the last errors read, beside the URL's own
	// password: the broker's URL.
	Secrets []string
	// Dead are the drainers whose claims to release once the outbox is
	// read, and their lease.
	Dead  []string
	Lease time.Duration
}

// Health is what one read found.
type Health struct {
	// Table is the resolved table's name.
	Table  string
	Status OutboxStatus
	// Released are the claims given back for each dead drainer, or why
	// they could not be.
	Released []Release
}

// Release is the release of a dead drainer's claims.
type Release struct {
	Drainer string
	Rows    int64
	Err     error
}

// ReadHealth reads the outbox's health at url, in a read-only transaction,
// and has the database plan the drainers' statements (see Rehearse), which
// it may refuse though it lets the outbox be read: then the error is a
// *StatementRefusedError and the health holds the numbers. Then it releases
// the claims of the dead drainers, each in a short transaction of its own.
// The error is an InvalidURLError, a *ConnectError, an *UnusableTableError,
// a *StatementRefusedError, or the query's.
func (r *Reader) ReadHealth(ctx context.Context, url string, req HealthRead) (Health, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	var health Health
	pool, err := r.pool(url)
	if err != nil {
		return health, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return health, &ConnectError{Err: r.noAnswer(ctx, secret.RedactError(err, url))}
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return health, &ConnectError{Err: fmt.Errorf("begin a read-only transaction: %w", r.noAnswer(ctx, secret.RedactError(err, url)))}
	}
	// Rolled back: it only read.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	t, err := r.readHealth(ctx, tx, url, req, &health)
	if err != nil {
		return health, err
	}
	_ = tx.Rollback(ctx)
	for _, id := range req.Dead {
		rows, err := r.release(ctx, conn, t.ReleaseHeld(id, req.Lease, nil))
		health.Released = append(health.Released, Release{Drainer: id, Rows: rows, Err: r.noAnswerErr(ctx, err, url)})
	}
	return health, nil
}

// readHealth is ReadHealth's transaction.
func (r *Reader) readHealth(ctx context.Context, tx pgx.Tx, url string, req HealthRead, health *Health) (*Table, error) {
	limits := ProbeLimits(r.timeout)
	if _, err := tx.Exec(ctx, limits.SQL, limits.Args...); err != nil {
		return nil, r.noAnswer(ctx, secret.RedactError(err, url))
	}
	t, err := ResolveOutbox(ctx, tx, req.Spec)
	if err != nil {
		if unusable := (*UnusableTableError)(nil); errors.As(err, &unusable) {
			return nil, err
		}
		return nil, r.noAnswer(ctx, secret.RedactError(err, url))
	}
	health.Table = t.Name()
	health.Status, err = ReadBoundedOutboxStatus(ctx, tx, t, req.MaxAttempts, req.CountLimit, append([]string{url}, req.Secrets...)...)
	if err != nil {
		return nil, r.noAnswer(ctx, secret.RedactError(err, url))
	}
	blocked := req.Spec.BlockedDrainers()
	if err := tx.QueryRow(ctx, blocked.SQL, blocked.Args...).Scan(&health.Status.BrokerBlocked); err != nil {
		return nil, r.noAnswer(ctx, secret.RedactError(err, url))
	}
	if req.BlockedKeys {
		blocked, err := ReadBlockedKeys(ctx, tx, t, req.CountLimit)
		if err != nil {
			return nil, r.noAnswer(ctx, secret.RedactError(err, url))
		}
		health.Status.Blocked = &blocked
	}
	// Last, since a refused rehearsal ends the transaction: the numbers
	// are read, and go with the refusal.
	if err := Rehearse(ctx, tx, t, req.MaxAttempts); err != nil {
		if refused := (*StatementRefusedError)(nil); errors.As(err, &refused) {
			return nil, err
		}
		return nil, r.noAnswer(ctx, secret.RedactError(err, url))
	}
	return t, nil
}

// release runs one release in a transaction of its own, bounded on the
// server like the read, and returns the rows it released.
func (r *Reader) release(ctx context.Context, conn *pgxpool.Conn, release Statement) (int64, error) {
	limits := ProbeLimits(r.timeout)
	var released int64
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, limits.SQL, limits.Args...); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, release.SQL, release.Args...)
		released = tag.RowsAffected()
		return err
	})
	return released, err
}

// Change replays or parks the outbox's poisoned rows at url as req says: the
// same statements as spillway poisoned, on one connection of its own, closed
// when it is done (a change is rare, and holds its connection for every
// batch). The timeout bounds the connect, the catalog look-up and each
// statement on the server; path names the request's fields in a refusal.
// It returns the resolved table's name and what was done, also when it
// stopped part way. The error is an InvalidURLError, a *ConnectError, an
// *UnusableTableError, an *InvalidSelectorError, or the query's.
func (r *Reader) Change(ctx context.Context, url string, spec TableSpec, req PoisonedRequest, path *field.Path) (string, PoisonedChange, error) {
	cfg, err := operatorPoolConfig(url, r.timeout)
	if err != nil {
		return "", PoisonedChange{}, err
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return "", PoisonedChange{}, InvalidURLError{}
	}
	defer pool.Close()
	bounded, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	conn, err := pool.Acquire(bounded)
	if err != nil {
		return "", PoisonedChange{}, &ConnectError{Err: r.noAnswer(bounded, secret.RedactError(err, url))}
	}
	defer conn.Release()
	t, err := ResolveOutbox(bounded, conn, spec)
	if err != nil {
		if unusable := (*UnusableTableError)(nil); errors.As(err, &unusable) {
			return "", PoisonedChange{}, err
		}
		return "", PoisonedChange{}, r.noAnswer(bounded, secret.RedactError(err, url))
	}
	req.StatementTimeout = r.timeout
	done, err := ChangePoisoned(ctx, conn, t, req, path)
	if invalid := (*InvalidSelectorError)(nil); err != nil && !errors.As(err, &invalid) {
		err = r.noAnswer(ctx, secret.RedactError(err, url))
	}
	return t.Name(), done, err
}

// noAnswer says plainly that the database did not answer in time, where
// pgx would say "context deadline exceeded".
func (r *Reader) noAnswer(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("no answer within %s", r.timeout)
	}
	return err
}

// noAnswerErr is noAnswer of a redacted err, or nil.
func (r *Reader) noAnswerErr(ctx context.Context, err error, url string) error {
	if err == nil {
		return nil
	}
	return r.noAnswer(ctx, secret.RedactError(err, url))
}
