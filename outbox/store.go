package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/spillway-io/spillway/secret"
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
	// place is the row's place in its claim's due order.
	place int64
}

// Claim is what one claim took: its rows, in due order, and its token.
type Claim struct {
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
func (c Claim) Full(batchSize int) bool {
	return len(c.Rows) >= batchSize || (len(c.Rows) > 0 && len(c.Rows) < c.Due) || c.Scanned >= batchSize
}

// lease is how a settle refers to row i of the claim.
func (c Claim) Lease(i int) Lease { return Lease{ID: c.Rows[i].ID, Row: c.Rows[i].At, Token: c.Token} }

// Leases are the claim's rows as a settle refers to them.
func (c Claim) Leases() []Lease {
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
}

// ConnectPool opens a pool whose sessions name the drainer in
// pg_stat_activity and, unless asked otherwise, commit asynchronously. With
// a URL file, every new connection reads the file again, so a rotated
// password is picked up as the pool replaces its connections.
func ConnectPool(ctx context.Context, src secret.URLSource, drainerID string, synchronousCommit bool) (*pgxpool.Pool, error) {
	url, err := src.Read()
	if err != nil {
		return nil, err
	}
	cfg, err := parsePoolConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "spillway-drainer/" + drainerID
	// Every statement the drainer runs is built to be planned once for any
	// parameters (the specs pin the claim's and the settles' generic plans);
	// left to choose, Postgres kept planning the claim afresh for each
	// execution, which cost about a third of the claim.
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	// A session makes each generic plan once, from the table's size then.
	// A new outbox, or a new partition, is nearly empty at that moment, and
	// there a sequential scan costs less than finding the claimed rows by
	// TID: every claim then read the whole table, a cost that grew with
	// each row published (1.4 ms of Postgres's CPU per claim of 8 rows after
	// 4,000 rows, 5.3 ms after 32,000) until an ANALYZE replanned it. Every
	// statement here reaches its rows through an index or by TID.
	cfg.ConnConfig.RuntimeParams["enable_seqscan"] = "off"
	// The ordered claim's generic plan is costed above jit_above_cost, and
	// Postgres compiled it at every execution: 120 ms of a 135 ms claim. No
	// statement of the drainer reads enough rows to repay a compilation.
	cfg.ConnConfig.RuntimeParams["jit"] = "off"
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
		return nil, fmt.Errorf("open database pool: %w", secret.RedactError(err, url))
	}
	return pool, nil
}

func parsePoolConfig(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's parse errors can quote the URL, password included.
		return nil, fmt.Errorf("parse database URL: invalid connection string (%s)", secret.RedactURL(url))
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

// StatementRefusedError is a statement of the drainers' that the database
// refuses for their table: a privilege revoked, a column gone.
type StatementRefusedError struct {
	// Statement is claim or settle.
	Statement string
	Table     string
	Answer    *pgconn.PgError
}

func (e *StatementRefusedError) Error() string {
	return fmt.Sprintf("the database refuses the drainers' %ss on %s: %s", e.Statement, e.Table, e.Answer.Error())
}

// Rehearse has the database plan the drainers' claim and settles on t
// without running them (see Table.Rehearsal), so that a read-only
// transaction with the drainers' credentials learns whether they would be
// refused: a *StatementRefusedError.
func Rehearse(ctx context.Context, db Querier, t *Table, maxAttempts int) error {
	for _, r := range t.Rehearsal(maxAttempts) {
		rows, err := db.Query(ctx, r.SQL, r.Args...)
		if err == nil {
			rows.Close()
			err = rows.Err()
		}
		if answer := refusal(err); answer != nil {
			return &StatementRefusedError{Statement: r.Name, Table: t.name, Answer: answer}
		}
		if err != nil {
			return fmt.Errorf("rehearse the drainers' %ss on %s: %w", r.Name, t.name, err)
		}
	}
	return nil
}

// Querier is what Catalog needs: a pool or a single connection.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// OpenStore resolves the spec against the live table, and checks that
// migrate has made it drainable: a drainer on a table without its due-time
// column or its claim index would claim nothing or scan the table on every
// claim.
func OpenStore(ctx context.Context, pool *pgxpool.Pool, spec TableSpec) (*Store, error) {
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
	return &Store{pool: pool, table: table, notes: notes}, nil
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

// Table is the resolved outbox table.
func (s *Store) Table() *Table { return s.table }

// ResetConnections closes the idle sessions at once and the others as their
// statements finish; new ones read the URL again: it was rotated.
func (s *Store) ResetConnections() { s.pool.Reset() }

// Claim runs phase 1: one statement, its own short transaction. The error
// may come after the claim committed, its result unread: see ReleaseHeld.
func (s *Store) Claim(ctx context.Context, p ClaimParams) (Claim, error) {
	stmt := s.table.Claim(p)
	rows, err := s.pool.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return Claim{}, fmt.Errorf("claim batch: %w", err)
	}
	if s.table.Ordered() {
		return collectOrderedClaim(rows)
	}
	c, err := collectClaim(rows)
	if err != nil {
		return Claim{}, fmt.Errorf("claim batch: %w", err)
	}
	return c, nil
}

// collectClaim reads a claim's rows through one set of scan targets into a
// slice sized once: every row carries the number of live rows that were due,
// which is as many as the claim can hold. A Row and its targets allocated
// per row, and the slice grown row by row, were a fifth of the drainer's
// garbage.
func collectClaim(rows pgx.Rows) (Claim, error) {
	defer rows.Close()
	var c Claim
	var row Row
	into := []any{&row.ID, &row.At.Table, &row.At.TID, &c.Token, &row.Payload, &row.Size, &row.RoutingKey, &row.Headers, &row.EnqueuedAt, &row.place, &c.Due}
	for rows.Next() {
		if err := rows.Scan(into...); err != nil {
			return Claim{}, err
		}
		if c.Rows == nil {
			c.Rows = make([]Row, 0, max(c.Due, 1))
		}
		c.Rows = append(c.Rows, row)
		row = Row{}
	}
	inDueOrder(c.Rows)
	return c, rows.Err()
}

// inDueOrder puts a claim's rows, which Postgres returns in the order its
// update found them (by ctid), in the order they came due, so that each
// drainer publishes the oldest first.
func inDueOrder(rows []Row) {
	slices.SortFunc(rows, func(a, b Row) int { return cmp.Compare(a.place, b.place) })
}

// collectOrderedClaim reads an ordered claim's rows: a row with a NULL id
// only carries the counts of a claim that took no row.
func collectOrderedClaim(rows pgx.Rows) (Claim, error) {
	var c Claim
	var id *string
	var table *uint32
	var token, enqueued *time.Time
	var size, place *int64
	var row Row
	scan := []any{&id, &table, &row.At.TID, &token, &row.Payload, &size, &row.RoutingKey, &row.Headers, &enqueued, &row.Key, &place, &c.Due, &c.Scanned, &c.Deferred}
	_, err := pgx.ForEachRow(rows, scan, func() error {
		if id != nil {
			row.ID, row.At.Table, row.Size, row.EnqueuedAt, row.place, c.Token = *id, *table, *size, *enqueued, *place, *token
			c.Rows = append(c.Rows, row)
		}
		row = Row{}
		return nil
	})
	if err != nil {
		return Claim{}, fmt.Errorf("claim batch: %w", err)
	}
	inDueOrder(c.Rows)
	return c, nil
}

// Settlement is phase 3's input: what became of each claimed row.
type Settlement struct {
	Published []Lease
	Failed    []Lease
	Reasons   []string // one per Failed lease
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
		stmts, counts = append(stmts, s.table.RecordFailures(drainerID, st.Failed, st.Reasons, f)), append(counts, &done.Failed)
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
	stmts, counts = append([]Statement{commitSynchronously}, stmts...), append([]*int64{nil}, counts...)
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
	stmt := s.table.ReleaseHeld(drainerID, lease, keep)
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
		tag, err := s.pool.Exec(ctx, stmt.SQL, stmt.Args...)
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(limit) {
			return total, nil
		}
	}
}

// ShelveSpent shelves, in batches of limit, the due rows that are not live
// (see Table.ShelveSpent), and returns how many.
func (s *Store) ShelveSpent(ctx context.Context, maxAttempts, limit int) (int64, error) {
	total, err := s.execBatches(ctx, s.table.ShelveSpent(maxAttempts, limit), limit)
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

// NotifyHush is a session of its own on which a drainer that claims on its
// own holds the notify trigger's lock in shared mode, so that commits into
// the table skip notifying. The session ending lets go of the lock, so a
// drainer that dies leaves no hush behind. Claim loop only.
type NotifyHush struct {
	pool *pgxpool.Pool
	spec TableSpec
	conn *pgx.Conn
	held bool
	// quietUntil: after a failure, no try before then, so that a database
	// refusing sessions is not asked for one at every claim.
	quietUntil time.Time
}

// NotifyHush returns the hush of spec's notifications, not yet held.
func (s *Store) NotifyHush(spec TableSpec) *NotifyHush { return &NotifyHush{pool: s.pool, spec: spec} }

const (
	// hushTimeout bounds a hush statement: the lock is only tried, never
	// waited for.
	hushTimeout = time.Second
	// hushRetry is how long a failed hush waits before the next try;
	// meanwhile commits notify, as without it.
	hushRetry = time.Minute
)

// Held reports whether commits are hushed by this drainer.
func (h *NotifyHush) Held() bool { return h.held }

// Hush tries the lock; a transaction notifying at that moment holds it, and
// then commits keep notifying until the next try.
func (h *NotifyHush) Hush(ctx context.Context) error {
	if h.held || time.Now().Before(h.quietUntil) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, hushTimeout)
	defer cancel()
	if h.conn == nil {
		conn, err := ownSession(ctx, h.pool)
		if err != nil {
			h.quietUntil = time.Now().Add(hushRetry)
			return fmt.Errorf("hush notifications on %s: %w", h.spec.NotifyChannel(), err)
		}
		h.conn = conn
	}
	stmt := h.spec.NotifyHush()
	if err := h.conn.QueryRow(ctx, stmt.SQL, stmt.Args...).Scan(&h.held); err != nil {
		h.Close()
		h.quietUntil = time.Now().Add(hushRetry)
		return fmt.Errorf("hush notifications on %s: %w", h.spec.NotifyChannel(), err)
	}
	return nil
}

// Unhush lets go of the lock; if that fails, closing the session does.
func (h *NotifyHush) Unhush(ctx context.Context) error {
	if !h.held {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, hushTimeout)
	defer cancel()
	stmt := h.spec.NotifyUnhush()
	if _, err := h.conn.Exec(ctx, stmt.SQL, stmt.Args...); err != nil {
		h.Close()
		return fmt.Errorf("unhush notifications on %s: %w", h.spec.NotifyChannel(), err)
	}
	h.held = false
	return nil
}

// Close ends the session, and with it the hush.
func (h *NotifyHush) Close() {
	closeSession(h.conn)
	h.conn, h.held = nil, false
}

// ownSession takes a connection out of the pool for a session-level lock,
// which must not go with it to a claim.
func ownSession(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, error) {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return pc.Hijack(), nil
}

// closeSession ends a session of ownSession's, and with it its locks.
func closeSession(conn *pgx.Conn) {
	if conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), sessionCloseTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}

// sessionCloseTimeout bounds the goodbye to a session: a database that does
// not answer must not hold up a drainer's shutdown.
const sessionCloseTimeout = time.Second

// Roster is a session of its own on which a capped drainer holds the
// table's roster lock in shared mode, and counts the other holders to take
// its share of --max-rate. The session ending lets go of the lock, so a
// drainer that dies or stops is out of the count at once. Used by one
// claim at a time.
type Roster struct {
	pool *pgxpool.Pool
	spec TableSpec
	conn *pgx.Conn
}

// Roster returns spec's roster, not yet joined.
func (s *Store) Roster(spec TableSpec) *Roster { return &Roster{pool: s.pool, spec: spec} }

// rosterTimeout bounds joining and counting; the count is only tried again a
// second later.
const rosterTimeout = time.Second

// Others joins the roster if this drainer has not, or has lost its session,
// and counts the other drainers in it.
func (r *Roster) Others(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, rosterTimeout)
	defer cancel()
	if r.conn == nil {
		conn, err := ownSession(ctx, r.pool)
		if err != nil {
			return 0, fmt.Errorf("join the drainers of %s: %w", r.spec.Name, err)
		}
		r.conn = conn
		join := r.spec.RosterJoin()
		var joined bool
		err = r.conn.QueryRow(ctx, join.SQL, join.Args...).Scan(&joined)
		if err == nil && !joined {
			err = errors.New("a session other than a drainer's holds its roster lock exclusively")
		}
		if err != nil {
			r.Close()
			return 0, fmt.Errorf("join the drainers of %s: %w", r.spec.Name, err)
		}
	}
	stmt := r.spec.RosterOthers()
	var n int
	if err := r.conn.QueryRow(ctx, stmt.SQL, stmt.Args...).Scan(&n); err != nil {
		r.Close()
		return 0, fmt.Errorf("count the drainers of %s: %w", r.spec.Name, err)
	}
	return n, nil
}

// Close ends the session, and with it this drainer's place in the roster.
func (r *Roster) Close() {
	closeSession(r.conn)
	r.conn = nil
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }
