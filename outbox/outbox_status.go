package outbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spillway-io/spillway/secret"
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
	// Blocked are the keys a failed row holds back, on a table ordered per
	// key whose failures block; nil otherwise.
	Blocked *BlockedKeys
	// BrokerBlocked is how many drainers of the table say their broker
	// blocks publishing (BlockedFlag); only the operator's read counts them.
	BrokerBlocked int64
}

// PoisonCause is one last error shared by poisoned rows.
type PoisonCause struct {
	// LastError is the error, scrubbed of secrets and cut at maxShownError
	// bytes (ScrubError); empty for rows that have none.
	LastError string
	Count     int64
	// OldestEnqueuedAt is nil on a table without enqueuedAt.
	OldestEnqueuedAt *time.Time
}

// topCauses is how many last errors the status lists.
const topCauses = 3

// causeCandidates is how many groups the statement returns: more than
// topCauses, because errors that differ only in a secret or past the cut
// become one cause once scrubbed.
const causeCandidates = 10

// maxCauseChars is where the statement groups and cuts a last error, well
// beyond what is shown: errors that differ only further on are one cause, a
// huge last_error costs the grouping no more than this (substr reads only
// the slice it needs), and a secret the cut splits lies past what is shown.
const maxCauseChars = 1024

// OutboxStatus renders the count of the backlog and the poisoned rows, and
// the backlog's oldest age. Its predicates are the claim's (pending is
// published_at IS NULL; poisoned is attempts >= max, or a due time of
// 'infinity', which a failure at max sets and only a replay undoes), so it
// reads only the claim index, never the published history; and the age is
// taken from the database's now(), like every other time the drainer
// compares. A table without available_at (not migrated yet) counts by
// attempts alone. A parked row is neither backlog nor poisoned: it is
// counted on its own, on a table with parked_at.
func (t *Table) OutboxStatus(maxAttempts int) Statement {
	return t.BoundedOutboxStatus(maxAttempts, 0)
}

// BoundedOutboxStatus is OutboxStatus reading at most limit pending rows
// (0: all of them), so a huge backlog costs a bounded query. When the limit
// is reached the counts and the age are lower bounds: "at least". The same
// scan groups the pending rows by class (live, poisoned, parked) and the
// poisoned ones by last error, so only the groups are kept, never the rows;
// the most common last errors come out as arrays, most rows first.
func (t *Table) BoundedOutboxStatus(maxAttempts, limit int) Statement {
	c := t.cols
	poisoned := "attempts >= $1"
	columns := []string{q(c.Attempts) + " AS attempts"}
	if c.AvailableAt != "" {
		poisoned = "(attempts >= $1 OR available_at = 'infinity')"
		columns = append(columns, q(c.AvailableAt)+" AS available_at")
	}
	enqueuedAt, oldest := "NULL::timestamptz", "NULL::bigint"
	if c.EnqueuedAt != "" {
		enqueuedAt = q(c.EnqueuedAt)
		oldest = "coalesce((extract(epoch FROM now() - min(oldest) FILTER (WHERE class = 'live')) * 1000)::bigint, 0)"
	}
	lastError, causes := "NULL::text", "NULL::text[], NULL::bigint[], NULL::timestamptz[]"
	if c.LastError != "" {
		lastError = q(c.LastError)
		causes = `(SELECT array_agg(coalesce(cause, '') ORDER BY n DESC, cause) FROM top),
	(SELECT array_agg(n ORDER BY n DESC, cause) FROM top),
	(SELECT array_agg(oldest ORDER BY n DESC, cause) FROM top)`
	}
	parked, parkedCount := "false", "NULL::bigint"
	if c.ParkedAt != "" {
		parked, parkedCount = q(c.ParkedAt)+" IS NOT NULL", "coalesce(sum(n) FILTER (WHERE class = 'parked'), 0)::bigint"
	}
	columns = append(columns, enqueuedAt+" AS enqueued_at", lastError+" AS last_error", parked+" AS parked")
	capped, bound := "false", ""
	args := []any{maxAttempts}
	if limit > 0 {
		capped, bound = "coalesce(sum(n), 0) >= $2", " LIMIT $2"
		args = append(args, limit)
	}
	sql := strings.Join([]string{
		"WITH groups AS MATERIALIZED (",
		"\tSELECT class, CASE WHEN class = 'poisoned' THEN substr(last_error, 1, " + strconv.Itoa(maxCauseChars) + ") END AS cause,",
		"\t\tcount(*) AS n, min(enqueued_at) AS oldest",
		"\tFROM (",
		"\t\tSELECT CASE WHEN parked THEN 'parked' WHEN " + poisoned + " THEN 'poisoned' ELSE 'live' END AS class, enqueued_at, last_error",
		"\t\tFROM (SELECT " + strings.Join(columns, ", "),
		"\t\t\tFROM " + t.ident + " WHERE " + q(c.PublishedAt) + " IS NULL" + bound + ") pending",
		"\t) classed",
		"\tGROUP BY 1, 2",
		"), top AS (",
		"\tSELECT cause, n, oldest FROM groups WHERE class = 'poisoned' ORDER BY n DESC, cause LIMIT " + strconv.Itoa(causeCandidates),
		")",
		"SELECT coalesce(sum(n) FILTER (WHERE class = 'live'), 0)::bigint,",
		"\tcoalesce(sum(n) FILTER (WHERE class = 'poisoned'), 0)::bigint,",
		"\t" + parkedCount + ",",
		"\t" + oldest + ",",
		"\t" + capped + ",",
		"\t" + causes,
		"FROM groups",
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
// limit pending rows (0: all). The last errors are scrubbed of secrets (the
// connection URLs the caller knows, and whatever looks like a credential)
// before they leave this function.
func ReadBoundedOutboxStatus(ctx context.Context, db Querier, t *Table, maxAttempts, limit int, secrets ...string) (OutboxStatus, error) {
	stmt := t.BoundedOutboxStatus(maxAttempts, limit)
	rows, err := db.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return OutboxStatus{}, fmt.Errorf("read status of %s: %w", t.Name(), err)
	}
	var s OutboxStatus
	var ageMillis, parked *int64
	var causes []string
	var counts []int64
	var oldest []*time.Time
	scan := []any{&s.Backlog, &s.Poisoned, &parked, &ageMillis, &s.Capped, &causes, &counts, &oldest}
	if _, err := pgx.ForEachRow(rows, scan, func() error { return nil }); err != nil {
		return OutboxStatus{}, fmt.Errorf("read status of %s: %w", t.Name(), err)
	}
	if ageMillis != nil {
		s.OldestPendingAge, s.AgeKnown = time.Duration(*ageMillis)*time.Millisecond, true
	}
	if parked != nil {
		s.Parked, s.ParkedKnown = *parked, true
	}
	s.PoisonedBy = topPoisonCauses(causes, counts, oldest, secrets)
	return s, nil
}

// topPoisonCauses scrubs the grouped last errors, merges those that read
// the same once scrubbed and cut, and keeps the topCauses with most rows.
func topPoisonCauses(causes []string, counts []int64, oldest []*time.Time, secrets []string) []PoisonCause {
	var out []PoisonCause
	index := map[string]int{}
	for i, cause := range causes {
		text := secret.Scrub(cause, secrets...)
		if j, ok := index[text]; ok {
			out[j].Count += counts[i]
			if o := oldest[i]; o != nil && (out[j].OldestEnqueuedAt == nil || o.Before(*out[j].OldestEnqueuedAt)) {
				out[j].OldestEnqueuedAt = o
			}
			continue
		}
		index[text] = len(out)
		out = append(out, PoisonCause{LastError: text, Count: counts[i], OldestEnqueuedAt: oldest[i]})
	}
	slices.SortStableFunc(out, func(a, b PoisonCause) int { return cmp.Compare(b.Count, a.Count) })
	return out[:min(len(out), topCauses)]
}

// BlockedKeys are the ordering keys whose later rows a failed row holds
// back, under block.
type BlockedKeys struct {
	Count int64
	// OldestKey is the key of the oldest failed row, by enqueue order, and
	// OldestEnqueuedAt that row's enqueued_at (nil on a table without
	// enqueuedAt): the key has had undelivered events since then.
	OldestKey        string
	OldestEnqueuedAt *time.Time
}

// ReadBlockedKeys counts the blocked keys of an ordered table, reading at
// most limit pending rows (0: all). Under skip no key is ever blocked by a
// failure, and nothing is read.
func ReadBlockedKeys(ctx context.Context, db Querier, t *Table, limit int) (BlockedKeys, error) {
	var b BlockedKeys
	if !t.Ordered() || t.order.skip {
		return b, nil
	}
	stmt := t.BlockedKeys(limit)
	var oldest *string
	rows, err := db.Query(ctx, stmt.SQL, stmt.Args...)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&b.Count, &oldest, &b.OldestEnqueuedAt}, func() error { return nil })
	}
	if err != nil {
		return BlockedKeys{}, fmt.Errorf("read blocked keys of %s: %w", t.Name(), err)
	}
	if oldest != nil {
		b.OldestKey = *oldest
	}
	return b, nil
}
