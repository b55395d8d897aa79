package outbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Row is one claimed outbox row.
type Row struct {
	ID string
	// At is where this claim's version of the row lives; settles find it
	// there.
	At Locator
	// Payload is nil when the row is over the size limit; Size says by how much.
	Payload    []byte
	Size       int64
	RoutingKey *string
	Headers    []byte
	EnqueuedAt time.Time
	// Key is the row's ordering key, on an ordered table; nil otherwise.
	Key *string
	// TraceParent and TraceState are the row's trace context columns; nil
	// where the table has none, or the row holds NULL.
	TraceParent, TraceState *string
	// place is the row's place in its claim's due order.
	place int64
}

// Claimed is what one claim took: its rows, in due order, and its token.
type Claimed struct {
	Rows []Row
	// Token is the claim's transaction time, stamped in claimed_at: every
	// settle of its rows is fenced on it.
	Token time.Time
	// Due is the number of rows that were due and live when the claim ran,
	// up to the batch size; more than len(Rows) means the byte budget cut
	// the claim short, and more rows are waiting.
	Due int
	// Scanned is the due rows an ordered claim read, claimed or sent to
	// wait behind their key's head; 0 on an unordered table.
	Scanned int
	// Deferred is the due rows an ordered claim left due, neither claimed
	// nor sent to wait, because the row holding them back was being
	// settled: the next claim, moments later, sees how it went.
	Deferred int
}

// Full reports whether the claim took all it could, so that more rows are
// likely due: a full batch, a claim its byte budget cut short, or an ordered
// claim that read a full batch of due rows, however few were heads.
func (c Claimed) Full(batchSize int) bool {
	return len(c.Rows) >= batchSize || (len(c.Rows) > 0 && len(c.Rows) < c.Due) || c.Scanned >= batchSize
}

// lease is how a settle refers to row i of the claim.
func (c Claimed) Lease(i int) Lease {
	return Lease{ID: c.Rows[i].ID, Row: c.Rows[i].At, Token: c.Token}
}

// Leases are the claim's rows as a settle refers to them.
func (c Claimed) Leases() []Lease {
	leases := make([]Lease, len(c.Rows))
	for i := range c.Rows {
		leases[i] = c.Lease(i)
	}
	return leases
}

// Store runs the table's statements on a pgx pool. It holds no transaction
// open beyond a single statement or settle batch.
type Store struct {
	pool  *pgxpool.Pool
	table *Table
	notes []string
	// sessions is where the sessions of a drainer's own are taken from
	// (sessions.go): the pool itself, a direct pool beside a transaction
	// pooler, or nil, for none.
	sessions *pgxpool.Pool
	// settings, through a transaction pooler, opens each claim and settle.
	settings *Statement
}

// StoreOption changes how a Store reaches its database.
type StoreOption func(*Store)

// TransactionPooled is a store whose pool goes through a pooler in
// transaction mode: each claim and settle opens with the session settings,
// and the sessions of a drainer's own come from direct, a pool past the
// pooler, or, if it is nil, are done without.
func TransactionPooled(direct *pgxpool.Pool, synchronousCommit bool) StoreOption {
	return func(s *Store) {
		settings := transactionSettings(synchronousCommit)
		s.sessions, s.settings = direct, &settings
	}
}

// Table is the resolved outbox table.
func (s *Store) Table() *Table { return s.table }

// ResetConnections closes the idle sessions at once and the others as their
// statements finish; new ones read the URL again: it was rotated.
func (s *Store) ResetConnections() { s.pool.Reset() }

// failed passes on a statement's error, and drops every session when the
// server answered read-only: it is a standby, or a primary demoted in a
// switchover, and new sessions find the primary (a multi-host URL's
// target_session_attrs=read-write skips the others).
func (s *Store) failed(err error) error {
	if ReadOnly(err) {
		s.pool.Reset()
	}
	return err
}

// Claim runs phase 1: one statement, its own short transaction. The error
// may come after the claim committed, its result unread: see ReleaseHeld.
func (s *Store) Claim(ctx context.Context, p ClaimParams) (Claimed, error) {
	c, err := s.claim(ctx, p)
	return c, s.failed(err)
}

func (s *Store) claim(ctx context.Context, p ClaimParams) (Claimed, error) {
	stmt := s.table.Claim(p)
	var before []Statement
	if s.table.claims != "" {
		before = append(before, s.table.claimLock())
	}
	rows, err := s.query(ctx, stmt, before...)
	if err != nil {
		return Claimed{}, fmt.Errorf("claim batch: %w", err)
	}
	if s.table.Ordered() {
		return collectOrderedClaim(rows)
	}
	c, err := collectClaim(rows)
	if err != nil {
		return Claimed{}, fmt.Errorf("claim batch: %w", err)
	}
	return c, nil
}

// collectClaim reads a claim's rows through one set of scan targets into a
// slice sized once: every row carries the number of live rows that were due,
// which is as many as the claim can hold. A Row and its targets allocated
// per row, and the slice grown row by row, were a fifth of the drainer's
// garbage.
func collectClaim(rows pgx.Rows) (Claimed, error) {
	defer rows.Close()
	var c Claimed
	var row Row
	into := []any{&row.ID, &row.At.Table, &row.At.TID, &c.Token, &row.Payload, &row.Size, &row.RoutingKey, &row.Headers, &row.EnqueuedAt, &row.place, &c.Due, &row.TraceParent, &row.TraceState}
	for rows.Next() {
		if err := rows.Scan(into...); err != nil {
			return Claimed{}, err
		}
		if c.Rows == nil {
			c.Rows = make([]Row, 0, max(c.Due, 1))
		}
		c.Rows = append(c.Rows, row)
		row = Row{}
	}
	inDueOrder(c.Rows)
	rows.Close() // before Err: a batch's commit answers at its close
	return c, rows.Err()
}

// query runs stmt after the statements before, and through a transaction
// pooler after the session settings, in one transaction and round trip.
func (s *Store) query(ctx context.Context, stmt Statement, before ...Statement) (pgx.Rows, error) {
	results, err := s.sendAfter(ctx, stmt, before)
	if err != nil {
		return nil, err
	}
	if results == nil {
		return s.pool.Query(ctx, stmt.SQL, stmt.Args...)
	}
	rows, err := results.Query()
	if err != nil {
		_ = results.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, results: results}, nil
}

// exec runs stmt as query does, for its row count.
func (s *Store) exec(ctx context.Context, stmt Statement) (pgconn.CommandTag, error) {
	results, err := s.sendAfter(ctx, stmt, nil)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if results == nil {
		return s.pool.Exec(ctx, stmt.SQL, stmt.Args...)
	}
	tag, err := results.Exec()
	if cerr := results.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// sendAfter sends the session settings (through a transaction pooler), the
// statements before and stmt as one batch, and returns its results with all
// but stmt's read; none when stmt goes alone.
func (s *Store) sendAfter(ctx context.Context, stmt Statement, before []Statement) (pgx.BatchResults, error) {
	if s.settings != nil {
		before = append([]Statement{*s.settings}, before...)
	}
	if len(before) == 0 {
		return nil, nil
	}
	batch := &pgx.Batch{}
	for _, b := range append(before, stmt) {
		batch.Queue(b.SQL, b.Args...)
	}
	results := s.pool.SendBatch(ctx, batch)
	for range before {
		if _, err := results.Exec(); err != nil {
			_ = results.Close()
			return nil, err
		}
	}
	return results, nil
}

// batchRows are the rows of a batch's last statement; closing them ends the
// batch, whose commit may fail.
type batchRows struct {
	pgx.Rows
	results pgx.BatchResults
	err     error
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if err := r.results.Close(); err != nil && r.err == nil {
		r.err = err
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// inDueOrder puts a claim's rows, which Postgres returns in the order its
// update found them (by ctid), in the order they came due, so that each
// drainer publishes the oldest first.
func inDueOrder(rows []Row) {
	slices.SortFunc(rows, func(a, b Row) int { return cmp.Compare(a.place, b.place) })
}

// collectOrderedClaim reads an ordered claim's rows: a row with a NULL id
// only carries the counts of a claim that took no row.
func collectOrderedClaim(rows pgx.Rows) (Claimed, error) {
	var c Claimed
	var id *string
	var table *uint32
	var token, enqueued *time.Time
	var size, place *int64
	var row Row
	scan := []any{&id, &table, &row.At.TID, &token, &row.Payload, &size, &row.RoutingKey, &row.Headers, &enqueued, &row.Key, &place, &c.Due, &c.Scanned, &c.Deferred, &row.TraceParent, &row.TraceState}
	_, err := pgx.ForEachRow(rows, scan, func() error {
		if id != nil {
			row.ID, row.At.Table, row.Size, row.EnqueuedAt, row.place, c.Token = *id, *table, *size, *enqueued, *place, *token
			c.Rows = append(c.Rows, row)
		}
		row = Row{}
		return nil
	})
	if err != nil {
		return Claimed{}, fmt.Errorf("claim batch: %w", err)
	}
	inDueOrder(c.Rows)
	return c, nil
}

// Settlement is phase 3's input: what became of each claimed row.
type Settlement struct {
	Published []Lease
	Failed    []Lease
	Failures  []Failure // one per Failed lease
	Released  []Lease
	// Advanced are the ordering keys whose head this settle publishes (or,
	// under skip, poisons): each key's next row may go.
	Advanced []string
	// DeletePublished deletes the published rows instead of marking them:
	// published rows are not kept.
	DeletePublished bool
	// TimeCommit commits the settle synchronously and times the commit.
	TimeCommit bool
}

// Settled counts the rows each statement changed. Fewer than asked means the
// lease was taken over by another claim in the meantime. Woken is the rows
// made due because their key's head was settled.
type Settled struct {
	Published, Failed, Released, Woken int64
	// Commit is how long the commit took, when timed.
	Commit time.Duration
}

// Settle runs phase 3 as one round trip: at most one statement per outcome,
// in one implicit transaction.
func (s *Store) Settle(ctx context.Context, drainerID string, st Settlement, f FailurePolicy) (Settled, error) {
	done, err := s.settle(ctx, drainerID, st, f)
	return done, s.failed(err)
}

func (s *Store) settle(ctx context.Context, drainerID string, st Settlement, f FailurePolicy) (Settled, error) {
	var stmts []Statement
	var counts []*int64
	var done Settled
	if len(st.Published) > 0 {
		mark := s.table.MarkPublished
		if st.DeletePublished {
			mark = s.table.DeletePublished
		}
		stmts, counts = append(stmts, mark(drainerID, st.Published)), append(counts, &done.Published)
	}
	if len(st.Failed) > 0 {
		stmts, counts = append(stmts, s.table.RecordFailures(drainerID, st.Failed, st.Failures, f)), append(counts, &done.Failed)
	}
	if len(st.Released) > 0 {
		stmts, counts = append(stmts, s.table.Release(drainerID, st.Released)), append(counts, &done.Released)
	}
	if len(st.Advanced) > 0 && s.table.Ordered() {
		// After the marks, in the same transaction: it sees the heads settled.
		stmts, counts = append(stmts, s.table.WakeSuccessors(st.Advanced, f.MaxAttempts)), append(counts, &done.Woken)
	}
	if len(stmts) == 0 {
		return done, nil
	}
	if s.table.claims != "" {
		// Last: the settles above are fenced on the claims' rows.
		all := slices.Concat(st.Published, st.Failed, st.Released)
		stmts, counts = append(stmts, s.table.endClaims(drainerID, all)), append(counts, nil)
	}
	if s.settings != nil {
		stmts, counts = append([]Statement{*s.settings}, stmts...), append([]*int64{nil}, counts...)
	}
	if !st.TimeCommit {
		if err := sendSettle(ctx, s.pool, stmts, counts); err != nil {
			return Settled{}, err
		}
		return done, nil
	}
	// Timed, the settle runs in a transaction of its own that commits
	// synchronously, so its commit waits for the WAL as an application's
	// does.
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return Settled{}, fmt.Errorf("settle: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// After the session settings, whose synchronous_commit it overrides.
	at := 0
	if s.settings != nil {
		at = 1
	}
	stmts, counts = slices.Insert(stmts, at, commitSynchronously), slices.Insert(counts, at, nil)
	if err := sendSettle(ctx, tx, stmts, counts); err != nil {
		return Settled{}, err
	}
	start := time.Now()
	if err := tx.Commit(ctx); err != nil {
		return Settled{}, fmt.Errorf("settle commit: %w", err)
	}
	done.Commit = time.Since(start)
	return done, nil
}

// commitSynchronously makes the rest of its transaction commit synchronously,
// whatever the session's setting.
var commitSynchronously = Statement{SQL: "SELECT set_config('synchronous_commit', 'on', true)"}

// sendSettle runs stmts in one round trip and stores each one's row count
// where counts points, unless that is nil.
func sendSettle(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, stmts []Statement, counts []*int64) error {
	batch := &pgx.Batch{}
	for _, stmt := range stmts {
		batch.Queue(stmt.SQL, stmt.Args...)
	}
	results := db.SendBatch(ctx, batch)
	for _, n := range counts {
		tag, err := results.Exec()
		if err != nil {
			_ = results.Close()
			return fmt.Errorf("settle batch: %w", err)
		}
		if n != nil {
			*n = tag.RowsAffected()
		}
	}
	if err := results.Close(); err != nil {
		return fmt.Errorf("settle batch: %w", err)
	}
	return nil
}

// ReleaseHeld frees every claim held under drainerID but those of the claims
// whose tokens are kept, and returns how many rows it freed.
func (s *Store) ReleaseHeld(ctx context.Context, drainerID string, lease time.Duration, keep []time.Time) (int64, error) {
	tag, err := s.exec(ctx, s.table.ReleaseHeld(drainerID, lease, keep))
	if err != nil {
		return 0, fmt.Errorf("release claims of %s: %w", drainerID, s.failed(err))
	}
	return tag.RowsAffected(), nil
}

// Prune runs one retention statement in bounded batches until a batch comes
// back short, and returns how many rows it deleted. Each batch is its own
// short transaction, so no lock is held for long.
func (s *Store) Prune(ctx context.Context, stmt Statement, limit int) (int64, error) {
	total, err := s.execBatches(ctx, stmt, limit)
	if err != nil {
		return total, fmt.Errorf("prune %s: %w", s.table.Name(), err)
	}
	return total, nil
}

// execBatches runs a statement that changes at most limit rows, each run its
// own short transaction, until a run comes back short, and returns how many
// rows the runs changed.
func (s *Store) execBatches(ctx context.Context, stmt Statement, limit int) (int64, error) {
	var total int64
	for {
		tag, err := s.exec(ctx, stmt)
		if err != nil {
			return total, s.failed(err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(limit) {
			return total, nil
		}
	}
}

// ShelveSpent shelves, in batches of limit, the due rows that are not live
// (see Table.ShelveSpent), and returns how many.
func (s *Store) ShelveSpent(ctx context.Context, maxAttempts int, lease time.Duration, limit int) (int64, error) {
	total, err := s.execBatches(ctx, s.table.ShelveSpent(maxAttempts, lease, limit), limit)
	if err != nil {
		return total, fmt.Errorf("shelve spent rows of %s: %w", s.table.Name(), err)
	}
	return total, nil
}

// WakeStranded makes due, in batches of limit, the waiting rows of an
// ordered table that nothing holds back any more, and returns how many.
func (s *Store) WakeStranded(ctx context.Context, maxAttempts, limit int) (int64, error) {
	total, err := s.execBatches(ctx, s.table.WakeStranded(maxAttempts, limit), limit)
	if err != nil {
		return total, fmt.Errorf("wake stranded rows of %s: %w", s.table.Name(), err)
	}
	return total, nil
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }
