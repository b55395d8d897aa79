package drainer

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// OutboxStatus is the outbox's health as the operator reports it.
type OutboxStatus struct {
	// Backlog is the pending rows a drainer may still claim: not poisoned.
	Backlog int64
	// Poisoned is the pending rows at maxAttempts, never claimed again until
	// they are replayed or parked.
	Poisoned int64
	// PoisonedBy are the most common last errors of the poisoned rows, most
	// rows first: at most three, none on a table without lastError.
	PoisonedBy []PoisonCause
	// Parked is the rows parked for a later replay; ParkedKnown is false on
	// a table without parkedAt.
	Parked      int64
	ParkedKnown bool
	// OldestPendingAge is the age of the backlog's oldest row by the
	// database's clock: zero when the backlog is empty.
	OldestPendingAge time.Duration
	// AgeKnown is false when the table has no enqueuedAt column to age by.
	AgeKnown bool
	// Capped is true when the read stopped at its limit of pending rows:
	// the counts and the age are then lower bounds.
	Capped bool
}

// PoisonCause is one last error shared by poisoned rows.
type PoisonCause struct {
	// LastError is the error as the table holds it, cut at
	// maxCauseChars characters and not yet scrubbed: it may quote anything a
	// broker said. Pass it through ScrubError before showing it.
	LastError string
	Count     int64
	// OldestEnqueuedAt is nil on a table without enqueuedAt.
	OldestEnqueuedAt *time.Time
}

// topCauses is how many last errors the status lists.
const topCauses = 3

// maxCauseChars is where the status groups and cuts a last error: errors
// that differ only further on are one cause, and a huge last_error costs
// the grouping no more than this.
const maxCauseChars = 1024

// OutboxStatus renders the count of the backlog and the poisoned rows, and
// the backlog's oldest age. Its predicates are the claim's (pending is
// published_at IS NULL; poisoned is attempts >= max, or a due time of
// 'infinity', which a failure at max sets and only a replay undoes), so it
// reads only the claim index, never the published history; and the age is
// taken from the database's now(), like every other time the drainer
// compares. A table without available_at (not migrated yet) counts by
// attempts alone. A parked row is neither backlog nor poisoned: it is
// counted on its own.
func (t *Table) OutboxStatus(maxAttempts int) Statement {
	return t.BoundedOutboxStatus(maxAttempts, 0)
}

// BoundedOutboxStatus is OutboxStatus reading at most limit pending rows
// (0: all of them), so a huge backlog costs a bounded query. When the limit
// is reached the counts and the age are lower bounds: "at least". The same
// rows give the poisoned rows' most common last errors.
func (t *Table) BoundedOutboxStatus(maxAttempts, limit int) Statement {
	c := t.cols
	poisoned, columns := "attempts >= $1", []string{q(c.Attempts) + " AS attempts"}
	if c.AvailableAt != "" {
		poisoned = "(attempts >= $1 OR available_at = 'infinity')"
		columns = append(columns, q(c.AvailableAt)+" AS available_at")
	}
	enqueuedAt, oldest := "NULL::timestamptz", "NULL::bigint"
	if c.EnqueuedAt != "" {
		enqueuedAt = q(c.EnqueuedAt)
		oldest = "coalesce((extract(epoch FROM now() - min(enqueued_at) FILTER (WHERE live)) * 1000)::bigint, 0)"
	}
	lastError, parked, parkedCount := "NULL::text", "false", "NULL::bigint"
	if c.LastError != "" {
		lastError = "left(" + q(c.LastError) + ", " + strconv.Itoa(maxCauseChars) + ")"
	}
	if c.ParkedAt != "" {
		parked, parkedCount = q(c.ParkedAt)+" IS NOT NULL", "count(*) FILTER (WHERE parked)"
	}
	columns = append(columns, enqueuedAt+" AS enqueued_at", lastError+" AS last_error", parked+" AS parked")
	capped, bound := "false", ""
	args := []any{maxAttempts}
	if limit > 0 {
		capped, bound = "count(*) >= $2", " LIMIT $2"
		args = append(args, limit)
	}
	causes := "NULL::text[], NULL::bigint[], NULL::timestamptz[]"
	if c.LastError != "" {
		causes = `(SELECT array_agg(coalesce(last_error, '') ORDER BY n DESC, last_error) FROM top),
	(SELECT array_agg(n ORDER BY n DESC, last_error) FROM top),
	(SELECT array_agg(oldest ORDER BY n DESC, last_error) FROM top)`
	}
	sql := strings.Join([]string{
		"WITH pending AS MATERIALIZED (",
		"\tSELECT " + strings.Join(columns, ", "),
		"\tFROM " + t.ident + " WHERE " + q(c.PublishedAt) + " IS NULL" + bound,
		"), classed AS (",
		"\tSELECT *, NOT parked AND " + poisoned + " AS poisoned, NOT parked AND NOT " + poisoned + " AS live FROM pending",
		"), top AS (",
		"\tSELECT last_error, count(*) AS n, min(enqueued_at) AS oldest FROM classed WHERE poisoned",
		"\tGROUP BY last_error ORDER BY n DESC, last_error LIMIT " + strconv.Itoa(topCauses),
		")",
		"SELECT count(*) FILTER (WHERE live),",
		"\tcount(*) FILTER (WHERE poisoned),",
		"\t" + parkedCount + ",",
		"\t" + oldest + ",",
		"\t" + capped + ",",
		"\t" + causes,
		"FROM classed",
	}, "\n")
	return Statement{SQL: sql, Args: args}
}

// ProbeLimits renders the settings of a status read's transaction: no
// statement, lock wait or idle transaction outlives timeout on the server,
// even when the reader has given up. set_config, unlike startup parameters,
// passes through transaction-pooling proxies.
func ProbeLimits(timeout time.Duration) Statement {
	ms := strconv.FormatInt(max(timeout.Milliseconds(), 1), 10)
	return Statement{
		SQL: "SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $1, true), " +
			"set_config('idle_in_transaction_session_timeout', $1, true)",
		Args: []any{ms},
	}
}

// ReadOutboxStatus runs the table's status query.
func ReadOutboxStatus(ctx context.Context, db Querier, t *Table, maxAttempts int) (OutboxStatus, error) {
	return ReadBoundedOutboxStatus(ctx, db, t, maxAttempts, 0)
}

// ReadBoundedOutboxStatus runs the table's status query, reading at most
// limit pending rows (0: all).
func ReadBoundedOutboxStatus(ctx context.Context, db Querier, t *Table, maxAttempts, limit int) (OutboxStatus, error) {
	stmt := t.BoundedOutboxStatus(maxAttempts, limit)
	rows, err := db.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return OutboxStatus{}, fmt.Errorf("read status of %s: %w", t.Name(), err)
	}
	var s OutboxStatus
	var ageMillis, parked *int64
	var errs []string
	var counts []int64
	var oldest []*time.Time
	scan := []any{&s.Backlog, &s.Poisoned, &parked, &ageMillis, &s.Capped, &errs, &counts, &oldest}
	if _, err := pgx.ForEachRow(rows, scan, func() error { return nil }); err != nil {
		return OutboxStatus{}, fmt.Errorf("read status of %s: %w", t.Name(), err)
	}
	if ageMillis != nil {
		s.OldestPendingAge, s.AgeKnown = time.Duration(*ageMillis)*time.Millisecond, true
	}
	if parked != nil {
		s.Parked, s.ParkedKnown = *parked, true
	}
	for i := range errs {
		s.PoisonedBy = append(s.PoisonedBy, PoisonCause{LastError: errs[i], Count: counts[i], OldestEnqueuedAt: oldest[i]})
	}
	return s, nil
}
