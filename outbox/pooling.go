package outbox

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/spillway-io/spillway/secret"
)

// PoolMode is how the server a URL names hands out Postgres sessions.
type PoolMode string

const (
	// PoolModeSession is a session per connection: Postgres itself, or a
	// pooler in session mode. The default.
	PoolModeSession PoolMode = "session"
	// PoolModeTransaction is a server session per transaction, as
	// PgBouncer's pool_mode = transaction hands out: nothing set on a
	// session outlives its transaction.
	PoolModeTransaction PoolMode = "transaction"
)

// PoolOptions is who a drainer's pool is for and how its server pools.
type PoolOptions struct {
	// DrainerID names the sessions in pg_stat_activity.
	DrainerID         string
	SynchronousCommit bool
	Mode              PoolMode
	// Unprepared runs each statement unnamed, described once per connection
	// and sent whole at every execution, instead of pgx's named prepared
	// statements: a pooler in transaction mode hands each transaction
	// another server session, which has not prepared them, unless it
	// tracks them (PgBouncer 1.21+ with max_prepared_statements).
	Unprepared bool
}

// sessionSettings are the settings every drainer statement is built for:
// startup parameters of each session, or, through a transaction pooler, the
// first statement of each claim and settle (TransactionPooled).
func sessionSettings(synchronousCommit bool) [][2]string {
	settings := [][2]string{
		// Every statement the drainer runs is built to be planned once for
		// any parameters (the specs pin the claim's and the settles' generic
		// plans); left to choose, Postgres kept planning the claim afresh for
		// each execution, which cost about a third of the claim.
		{"plan_cache_mode", "force_generic_plan"},
		// A session makes each generic plan once, from the table's size
		// then. A new outbox, or a new partition, is nearly empty at that
		// moment, and there a sequential scan costs less than finding the
		// claimed rows by TID: every claim then read the whole table, a cost
		// that grew with each row published (1.4 ms of Postgres's CPU per
		// claim of 8 rows after 4,000 rows, 5.3 ms after 32,000) until an
		// ANALYZE replanned it. Every statement here reaches its rows
		// through an index or by TID.
		{"enable_seqscan", "off"},
		// The ordered claim's generic plan is costed above jit_above_cost,
		// and Postgres compiled it at every execution: 120 ms of a 135 ms
		// claim. No statement of the drainer reads enough rows to repay a
		// compilation.
		{"jit", "off"},
	}
	if !synchronousCommit {
		settings = append(settings, [2]string{"synchronous_commit", "off"})
	}
	return settings
}

// transactionSettings renders sessionSettings for the transaction that
// runs it; set before the next statement of the transaction is planned,
// they hold for it as startup parameters would.
func transactionSettings(synchronousCommit bool) Statement {
	var calls []string
	for _, kv := range sessionSettings(synchronousCommit) {
		calls = append(calls, fmt.Sprintf("set_config('%s', '%s', true)", kv[0], kv[1]))
	}
	return Statement{SQL: "SELECT " + strings.Join(calls, ", ")}
}

// Pooling is how the server a database URL names pools sessions, as a
// command's flags say.
type Pooling struct {
	Mode PoolMode
	// Direct is a URL past the pooler, to Postgres itself, for the sessions
	// of a drainer's own that a transaction pooler cannot keep; unset, the
	// drainer does without them.
	Direct secret.URLSource
	// PreparedStatements nil takes the mode's default: on in session mode,
	// off in transaction mode.
	PreparedStatements *bool
}

// Transaction reports whether the URL names a pooler in transaction mode.
func (p Pooling) Transaction() bool { return p.Mode == PoolModeTransaction }

// Options are the pool options of drainerID's pool under p.
func (p Pooling) Options(drainerID string, synchronousCommit bool) PoolOptions {
	prepared := !p.Transaction()
	if p.PreparedStatements != nil {
		prepared = *p.PreparedStatements
	}
	return PoolOptions{DrainerID: drainerID, SynchronousCommit: synchronousCommit, Mode: p.modeOrDefault(), Unprepared: !prepared}
}

func (p Pooling) modeOrDefault() PoolMode {
	if p.Mode == "" {
		return PoolModeSession
	}
	return p.Mode
}

// Validate checks the mode, and that a direct URL comes with transaction
// mode, the one it serves; path names the database.
func (p Pooling) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch p.modeOrDefault() {
	case PoolModeSession, PoolModeTransaction:
	default:
		errs = append(errs, field.NotSupported(path.Child("poolMode"), p.Mode, []PoolMode{PoolModeSession, PoolModeTransaction}))
	}
	if p.Direct.URL != "" || p.Direct.File != "" {
		if !p.Transaction() {
			errs = append(errs, field.Invalid(path.Child("directURL"), cmp.Or(secret.RedactURL(p.Direct.URL), p.Direct.File),
				"only serves a pooler in transaction mode: set poolMode to transaction, or leave it unset"))
		} else {
			errs = append(errs, p.Direct.Validate(path.Child("directURL"), "the URL past the pooler")...)
		}
	}
	return errs
}

// ConnectDrainer opens a drainer's pool on src and, past a pooler in
// transaction mode, its direct pool, with the options that open its store
// on them. close closes both.
func ConnectDrainer(ctx context.Context, src secret.URLSource, p Pooling, drainerID string, synchronousCommit bool) (
	pool *pgxpool.Pool, opts []StoreOption, close func(), err error) {
	pool, err = ConnectPool(ctx, src, p.Options(drainerID, synchronousCommit))
	if err != nil || !p.Transaction() {
		return pool, nil, closer(pool), err
	}
	var direct *pgxpool.Pool
	if p.Direct.URL != "" || p.Direct.File != "" {
		d := p.Direct
		d.TLS = src.TLS // the same server's certificates
		if direct, err = ConnectPool(ctx, d, Pooling{}.Options(drainerID, synchronousCommit)); err != nil {
			pool.Close()
			return nil, nil, nil, fmt.Errorf("direct URL: %w", err)
		}
	}
	return pool, []StoreOption{TransactionPooled(direct, synchronousCommit)}, closer(pool, direct), nil
}

// closer closes the pools that are open.
func closer(pools ...*pgxpool.Pool) func() {
	return func() {
		for _, p := range pools {
			if p != nil {
				p.Close()
			}
		}
	}
}
