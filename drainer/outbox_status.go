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
	// they are replayed.
	Poisoned int64
	// OldestPendingAge is the age of the backlog's oldest row by the
	// database's clock: zero when the backlog is empty.
	OldestPendingAge time.Duration
	// AgeKnown is false when the table has no enqueuedAt column to age by.
	AgeKnown bool
	// Capped is true when the read stopped at its limit of pending rows:
	// the counts and the age are then lower bounds.
	Capped bool
}

// OutboxStatus renders the count of the backlog and the poisoned rows, and
// the backlog's oldest age. Its predicates are the claim's (pending is
// published_at IS NULL; poisoned is attempts >= max, or a due time of
// 'infinity', which a failure at max sets and only a replay undoes), so it
// reads only the claim index, never the published history; and the age is
// taken from the database's now(), like every other time the drainer
// compares. A table without available_at (not migrated yet) counts by
// attempts alone.
func (t *Table) OutboxStatus(maxAttempts int) Statement {
	return t.BoundedOutboxStatus(maxAttempts, 0)
}

// BoundedOutboxStatus is OutboxStatus reading at most limit pending rows
// (0: all of them), so a huge backlog costs a bounded query. When the limit
// is reached the counts and the age are lower bounds: "at least".
func (t *Table) BoundedOutboxStatus(maxAttempts, limit int) Statement {
	c := t.cols
	backlog, availableAt := "attempts < $1", ""
	if c.AvailableAt != "" {
		backlog += " AND available_at <> 'infinity'"
		availableAt = ", " + q(c.AvailableAt) + " AS available_at"
	}
	enqueuedAt, oldest := "NULL::timestamptz", "NULL::bigint"
	if c.EnqueuedAt != "" {
		enqueuedAt = q(c.EnqueuedAt)
		oldest = "coalesce((extract(epoch FROM now() - min(enqueued_at) FILTER (WHERE " + backlog + ")) * 1000)::bigint, 0)"
	}
	capped, bound := "false", ""
	args := []any{maxAttempts}
	if limit > 0 {
		capped, bound = "count(*) >= $2", " LIMIT $2"
		args = append(args, limit)
	}
	sql := strings.Join([]string{
		"SELECT count(*) FILTER (WHERE " + backlog + "),",
		"\tcount(*) FILTER (WHERE NOT (" + backlog + ")),",
		"\t" + oldest + ",",
		"\t" + capped,
		"FROM (SELECT " + q(c.Attempts) + " AS attempts, " + enqueuedAt + " AS enqueued_at" + availableAt,
		"\tFROM " + t.ident + " WHERE " + q(c.PublishedAt) + " IS NULL" + bound + ") pending",
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
	var ageMillis *int64
	if _, err := pgx.ForEachRow(rows, []any{&s.Backlog, &s.Poisoned, &ageMillis, &s.Capped}, func() error { return nil }); err != nil {
		return OutboxStatus{}, fmt.Errorf("read status of %s: %w", t.Name(), err)
	}
	if ageMillis != nil {
		s.OldestPendingAge, s.AgeKnown = time.Duration(*ageMillis)*time.Millisecond, true
	}
	return s, nil
}
