package drainer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Row is one claimed outbox row.
type Row struct {
	ID string
	// Payload is nil when the row is over the size limit; Size says by how much.
	Payload    []byte
	Size       int64
	RoutingKey *string
	Headers    []byte
	EnqueuedAt time.Time
}

// Store runs the table's statements on a pgx pool. It holds no transaction
// open beyond a single statement or settle batch.
type Store struct {
	pool  *pgxpool.Pool
	table *Table
}

// ConnectPool opens a pool whose sessions name the drainer in
// pg_stat_activity and, unless asked otherwise, commit asynchronously. With
// a URL file, every new connection reads the file again, so a rotated
// password is picked up as the pool replaces its connections.
func ConnectPool(ctx context.Context, src URLSource, drainerID string, synchronousCommit bool) (*pgxpool.Pool, error) {
	url, err := src.Read()
	if err != nil {
		return nil, err
	}
	cfg, err := parsePoolConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "spillway-drainer/" + drainerID
	if !synchronousCommit {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	if src.File != "" {
		cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			url, err := src.Read()
			if err != nil {
				return err
			}
			fresh, err := parsePoolConfig(url)
			if err != nil {
				return err
			}
			// Where and who from the file; the session settings stay ours.
			f := fresh.ConnConfig
			cc.Host, cc.Port, cc.Database, cc.User, cc.Password = f.Host, f.Port, f.Database, f.User, f.Password
			cc.TLSConfig, cc.Fallbacks = f.TLSConfig, f.Fallbacks
			return nil
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", RedactError(err, url))
	}
	return pool, nil
}

func parsePoolConfig(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's parse errors can quote the URL, password included.
		return nil, fmt.Errorf("parse database URL: invalid connection string (%s)", RedactURL(url))
	}
	return cfg, nil
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

// Querier is what Catalog needs: a pool or a single connection.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// OpenStore resolves the spec against the live table.
func OpenStore(ctx context.Context, pool *pgxpool.Pool, spec TableSpec) (*Store, error) {
	cols, err := Catalog(ctx, pool, spec)
	if err != nil {
		return nil, err
	}
	return storeOver(pool, spec, cols)
}

// storeOver resolves the spec against catalog columns already read.
func storeOver(pool *pgxpool.Pool, spec TableSpec, cols []CatalogColumn) (*Store, error) {
	table, err := ResolveTable(spec, cols)
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool, table: table}, nil
}

// Table is the resolved outbox table.
func (s *Store) Table() *Table { return s.table }

// Claim runs phase 1: one statement, its own short transaction.
func (s *Store) Claim(ctx context.Context, p ClaimParams) ([]Row, error) {
	stmt := s.table.Claim(p)
	rows, err := s.pool.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return nil, fmt.Errorf("claim batch: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var row Row
		return row, r.Scan(&row.ID, &row.Payload, &row.Size, &row.RoutingKey, &row.Headers, &row.EnqueuedAt)
	})
	if err != nil {
		return nil, fmt.Errorf("claim batch: %w", err)
	}
	return claimed, nil
}

// Settlement is phase 3's input: what became of each claimed row.
type Settlement struct {
	Published []string
	Failed    []string
	Reasons   []string // one per Failed id
	Released  []string
}

// Settled counts the rows each statement changed. Fewer than asked means the
// lease was taken over by another drainer in the meantime.
type Settled struct {
	Published, Failed, Released int64
}

// Settle runs phase 3 as one round trip: at most one statement per outcome,
// in one implicit transaction.
func (s *Store) Settle(ctx context.Context, drainerID string, st Settlement, b Backoff) (Settled, error) {
	var stmts []Statement
	var counts []*int64
	var done Settled
	if len(st.Published) > 0 {
		stmts, counts = append(stmts, s.table.MarkPublished(drainerID, st.Published)), append(counts, &done.Published)
	}
	if len(st.Failed) > 0 {
		stmts, counts = append(stmts, s.table.RecordFailures(drainerID, st.Failed, st.Reasons, b)), append(counts, &done.Failed)
	}
	if len(st.Released) > 0 {
		stmts, counts = append(stmts, s.table.Release(drainerID, st.Released)), append(counts, &done.Released)
	}
	if len(stmts) == 0 {
		return done, nil
	}
	batch := &pgx.Batch{}
	for _, stmt := range stmts {
		batch.Queue(stmt.SQL, stmt.Args...)
	}
	results := s.pool.SendBatch(ctx, batch)
	for _, n := range counts {
		tag, err := results.Exec()
		if err != nil {
			_ = results.Close()
			return Settled{}, fmt.Errorf("settle batch: %w", err)
		}
		*n = tag.RowsAffected()
	}
	if err := results.Close(); err != nil {
		return Settled{}, fmt.Errorf("settle batch: %w", err)
	}
	return done, nil
}

// ReleaseAll frees every claim held under drainerID.
func (s *Store) ReleaseAll(ctx context.Context, drainerID string) (int64, error) {
	stmt := s.table.ReleaseAll(drainerID)
	tag, err := s.pool.Exec(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return 0, fmt.Errorf("release claims of %s: %w", drainerID, err)
	}
	return tag.RowsAffected(), nil
}

// Prune runs one retention statement in bounded batches until a batch comes
// back short, and returns how many rows it deleted. Each batch is its own
// short transaction, so no lock is held for long.
func (s *Store) Prune(ctx context.Context, stmt Statement, limit int) (int64, error) {
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, stmt.SQL, stmt.Args...)
		if err != nil {
			return total, fmt.Errorf("prune %s: %w", s.table.Name(), err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(limit) {
			return total, nil
		}
	}
}

// Listen holds a connection of its own in LISTEN on the table's notify
// channel. It calls listening once the LISTEN is in place and notified on
// every notification, and returns when the connection fails or ctx ends.
func (s *Store) Listen(ctx context.Context, spec TableSpec, listening, notified func()) error {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// Hijacked, the connection leaves the pool for good: a LISTEN session
	// must not be handed to a claim.
	conn := pc.Hijack()
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(ctx)
	}()
	if _, err := conn.Exec(ctx, spec.Listen().SQL); err != nil {
		return fmt.Errorf("listen on %s: %w", spec.NotifyChannel(), err)
	}
	listening()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		notified()
	}
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }
