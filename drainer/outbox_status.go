package drainer

import (
	"context"
	"fmt"
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
	c := t.cols
	backlog := fmt.Sprintf("%s < $1", q(c.Attempts))
	if c.AvailableAt != "" {
		backlog += fmt.Sprintf(" AND %s <> 'infinity'", q(c.AvailableAt))
	}
	oldest := "NULL::bigint"
	if c.EnqueuedAt != "" {
		oldest = fmt.Sprintf("coalesce((extract(epoch FROM now() - min(%s) FILTER (WHERE %s)) * 1000)::bigint, 0)",
			q(c.EnqueuedAt), backlog)
	}
	sql := strings.Join([]string{
		"SELECT count(*) FILTER (WHERE " + backlog + "),",
		"\tcount(*) FILTER (WHERE NOT (" + backlog + ")),",
		"\t" + oldest,
		"FROM " + t.ident + " WHERE " + q(c.PublishedAt) + " IS NULL",
	}, "\n")
	return Statement{SQL: sql, Args: []any{maxAttempts}}
}

// ReadOutboxStatus runs the table's status query.
func ReadOutboxStatus(ctx context.Context, db Querier, t *Table, maxAttempts int) (OutboxStatus, error) {
	stmt := t.OutboxStatus(maxAttempts)
	rows, err := db.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return OutboxStatus{}, fmt.Errorf("read status of %s: %w", t.Name(), err)
	}
	var s OutboxStatus
	var ageMillis *int64
	if _, err := pgx.ForEachRow(rows, []any{&s.Backlog, &s.Poisoned, &ageMillis}, func() error { return nil }); err != nil {
		return OutboxStatus{}, fmt.Errorf("read status of %s: %w", t.Name(), err)
	}
	if ageMillis != nil {
		s.OldestPendingAge, s.AgeKnown = time.Duration(*ageMillis)*time.Millisecond, true
	}
	return s, nil
}
