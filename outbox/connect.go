package outbox

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/spillway-io/spillway/secret"
)

// ConnectPool opens a pool whose sessions name the drainer in
// pg_stat_activity, probe a vanished server (keepaliveDialer) and, in
// session mode, carry sessionSettings and serverKeepalives. With a URL
// file, every new connection reads the file again, so a rotated password is
// picked up as the pool replaces its connections.
func ConnectPool(ctx context.Context, src secret.URLSource, o PoolOptions) (*pgxpool.Pool, error) {
	url, err := src.Read()
	if err != nil {
		return nil, err
	}
	cfg, err := parsePoolConfig(url, src.TLS)
	if err != nil {
		return nil, err
	}
	// PgBouncer passes application_name on to the server, and refuses a
	// startup parameter it does not track: the settings go per transaction.
	cfg.ConnConfig.RuntimeParams["application_name"] = "spillway-drainer/" + o.DrainerID
	if o.Mode != PoolModeTransaction {
		for _, kv := range append(sessionSettings(o.SynchronousCommit), serverKeepalives...) {
			cfg.ConnConfig.RuntimeParams[kv[0]] = kv[1]
		}
	}
	cfg.ConnConfig.DialFunc = keepaliveDialer(cfg.ConnConfig.ConnectTimeout).DialContext
	if o.Unprepared {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	if src.File != "" {
		cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			url, err := src.Read()
			if err != nil {
				return err
			}
			fresh, err := parsePoolConfig(url, src.TLS)
			if err != nil {
				return err
			}
			// Where and who from the file; the session settings stay ours.
			f := fresh.ConnConfig
			cc.Host, cc.Port, cc.Database, cc.User, cc.Password = f.Host, f.Port, f.Database, f.User, f.Password
			cc.TLSConfig, cc.Fallbacks, cc.ValidateConnect = f.TLSConfig, f.Fallbacks, f.ValidateConnect
			return nil
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", secret.RedactError(err, url))
	}
	return pool, nil
}

// A host that vanishes (a node lost with its network, a partition) sends
// nothing to say so, and TCP's own defaults notice only after hours: the
// server's, two hours and eleven minutes. Until then a vanished drainer's
// sessions hold what they held: its notify hush, which keeps every commit
// from waking the rest of the fleet, its place in the --max-rate roster, and
// the broker's blocked flag. Both ends therefore probe an idle connection
// after keepaliveIdle, every keepaliveInterval, and drop it after
// keepaliveCount probes unanswered: in about half a minute.
const (
	keepaliveIdle     = 15 * time.Second
	keepaliveInterval = 5 * time.Second
	keepaliveCount    = 3
)

// serverKeepalives are the startup parameters that have the server probe a
// session's client as keepaliveDialer probes the server. Sent in session
// mode only, as the session settings are: through a pooler in transaction
// mode the server's client is the pooler, and a drainer's own sessions go
// past it (Pooling.Direct).
var serverKeepalives = [][2]string{
	{"tcp_keepalives_idle", strconv.Itoa(int(keepaliveIdle.Seconds()))},
	{"tcp_keepalives_interval", strconv.Itoa(int(keepaliveInterval.Seconds()))},
	{"tcp_keepalives_count", strconv.Itoa(keepaliveCount)},
}

// keepaliveDialer dials the database's hosts within connect_timeout (0:
// none), probing idle connections as serverKeepalives has the server do.
// Without it a LISTEN session on a vanished server, whose reads wait for no
// deadline, was noticed after Go's default of two and a half minutes.
func keepaliveDialer(timeout time.Duration) *net.Dialer {
	return &net.Dialer{Timeout: timeout, KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: keepaliveIdle, Interval: keepaliveInterval, Count: keepaliveCount}}
}

func parsePoolConfig(url string, files secret.TLSFiles) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's parse errors can quote the URL, password included.
		return nil, fmt.Errorf("parse database URL: invalid connection string (%s)", secret.RedactURL(url))
	}
	if files.Enabled() {
		if err := verifyFull(&cfg.ConnConfig.Config, files); err != nil {
			return nil, fmt.Errorf("database TLS: %w", err)
		}
	}
	return cfg, nil
}

// verifyFull makes every host of cc (a multi-host URL's too) connect over
// TLS with files, verifying the server's certificate and its name, as
// sslmode=verify-full does; the URL's own sslmode and files give way. A
// host's second try without TLS (sslmode=prefer's) is dropped, and a Unix socket,
// over which Postgres speaks no TLS, keeps none.
func verifyFull(cc *pgconn.Config, files secret.TLSFiles) error {
	var err error
	if cc.TLSConfig, err = hostTLS(cc.Host, files); err != nil {
		return err
	}
	fallbacks := cc.Fallbacks[:0]
	seen := map[string]bool{fmt.Sprintf("%s:%d", cc.Host, cc.Port): true}
	for _, fb := range cc.Fallbacks {
		key := fmt.Sprintf("%s:%d", fb.Host, fb.Port)
		if seen[key] {
			continue
		}
		seen[key] = true
		if fb.TLSConfig, err = hostTLS(fb.Host, files); err != nil {
			return err
		}
		fallbacks = append(fallbacks, fb)
	}
	cc.Fallbacks = fallbacks
	return nil
}

func hostTLS(host string, files secret.TLSFiles) (*tls.Config, error) {
	if strings.HasPrefix(host, "/") {
		return nil, nil
	}
	return files.Config(host)
}

// Catalog reads the live columns of the spec's table; none means no table.
func Catalog(ctx context.Context, db Querier, spec TableSpec) ([]CatalogColumn, error) {
	stmt := spec.CatalogQuery()
	rows, err := db.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", spec.Name, err)
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (CatalogColumn, error) {
		var c CatalogColumn
		return c, r.Scan(&c.Name, &c.Type, &c.NotNull)
	})
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", spec.Name, err)
	}
	return cols, nil
}

// ResolveOutbox reads the spec's table from the catalog and resolves it
// against the mapping. A table that does not exist or does not fit is an
// *UnusableTableError: trying again will not change it, fixing the mapping
// or migrating will. A missing table is named by the database's own answer,
// with its SQLSTATE, as a drainer's claim would be.
func ResolveOutbox(ctx context.Context, db Querier, spec TableSpec) (*Table, error) {
	cols, err := Catalog(ctx, db, spec)
	if err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		if err := lookUpTable(ctx, db, spec); err != nil {
			if refusal(err) == nil {
				return nil, err
			}
			return nil, &UnusableTableError{Err: fmt.Errorf("table %s: %w; run spillway migrate to create it", spec.Name, err)}
		}
	}
	table, err := ResolveTable(spec, cols)
	if err != nil {
		return nil, &UnusableTableError{Err: err}
	}
	return table, nil
}

// lookUpTable asks the database for the spec's table, which answers with
// an error when there is none.
func lookUpTable(ctx context.Context, db Querier, spec TableSpec) error {
	stmt := spec.TableQuery()
	rows, err := db.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// Querier is what Catalog needs: a pool or a single connection.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// OpenStore resolves the spec against the live table, and checks that
// migrate has made it drainable: a drainer on a table without its due-time
// column or its claim index would claim nothing or scan the table on every
// claim.
func OpenStore(ctx context.Context, pool *pgxpool.Pool, spec TableSpec, opts ...StoreOption) (*Store, error) {
	table, err := ResolveOutbox(ctx, pool, spec)
	if err != nil {
		return nil, err
	}
	notes, err := checkDrainable(ctx, pool, spec, table)
	if err != nil {
		return nil, err
	}
	if table.settleByID, err = idIndexed(ctx, pool, table); err != nil {
		return nil, err
	}
	s := &Store{pool: pool, table: table, notes: notes, sessions: pool}
	for _, opt := range opts {
		opt(s)
	}
	return s, nil
}

// Notes are what the table lacks that the drainer drains without, and that
// spillway migrate would add: each worth a warning.
func (s *Store) Notes() []string { return s.notes }

// UnusableTableError is a table the drainer cannot drain as it is: waiting
// will not change it, running migrate or fixing the mapping will.
type UnusableTableError struct{ Err error }

func (e *UnusableTableError) Error() string { return e.Err.Error() }

func (e *UnusableTableError) Unwrap() error { return e.Err }

// checkDrainable refuses a table migrate has not finished: no due-time
// column, a nullable one, or a claim or published index missing, invalid,
// or of another shape than migrate builds. An index of the shape an
// earlier release built is drained through, with a note.
func checkDrainable(ctx context.Context, db Querier, spec TableSpec, t *Table) (notes []string, err error) {
	path := field.NewPath("database")
	if t.cols.AvailableAt == "" {
		return nil, &UnusableTableError{Err: field.NotFound(path.Child("columns", "availableAt"),
			fmt.Sprintf("%s in %s: every row's due time; run spillway migrate, which adds it", spec.Columns.physical("availableAt"), t.name))}
	}
	if !t.dueNotNull {
		return nil, &UnusableTableError{Err: field.Invalid(path.Child("columns", "availableAt"), t.cols.AvailableAt,
			fmt.Sprintf("must be NOT NULL with a default (now()) in %s: a row with a NULL due time would never be claimed", t.name))}
	}
	rel, err := lookUpRelation(ctx, db, spec)
	if err != nil {
		return nil, err
	}
	for _, def := range t.Indexes() {
		shape, found, err := lookUpIndex(ctx, db, def, rel)
		if err != nil {
			return nil, err
		}
		name := rel.objectName(def.Suffix)
		problem := ""
		switch {
		case !found:
			problem = "is missing"
		case !shape.Valid:
			problem = "is not valid (an interrupted build, or a partition without it)"
		case def.Superseded(shape):
			notes = append(notes, fmt.Sprintf("index %s on %s is on (%s), as an earlier release built it: claims read the rows they pass over from the table; run spillway migrate, which rebuilds it on (%s)",
				name, t.name, strings.Join(def.Supersedes, ", "), strings.Join(def.Columns, ", ")))
		case !def.Matches(shape):
			problem = "is not the index migrate builds"
		}
		if problem != "" {
			return nil, &UnusableTableError{Err: fmt.Errorf("index %s on %s %s: run spillway migrate", name, t.name, problem)}
		}
	}
	return notes, nil
}

// idIndexed reads whether the table's settles can find rows by id.
func idIndexed(ctx context.Context, db Querier, t *Table) (bool, error) {
	stmt := t.IDIndexQuery()
	rows, err := db.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return false, fmt.Errorf("look up an index on %s's id: %w", t.name, err)
	}
	indexed, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return false, fmt.Errorf("look up an index on %s's id: %w", t.name, err)
	}
	return indexed, nil
}
