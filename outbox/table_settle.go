package outbox

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// The statements of phase 3, the settle, and of what else gives rows back or takes them away: the release of a dead drainer's claims, retention's prunes.

// Locator is where the version of a row that a claim returned lives: its
// table's oid (a partition's, for a partitioned outbox) and its ctid.
type Locator struct {
	Table uint32
	TID   pgtype.TID
}

// Lease is one claimed row as its claim holds it: the row's id and locator,
// and the claim's token. A settle changes the row only while the locator and
// the token still match, so a row whose lease expired and was claimed again,
// even by the same drainer, is left to its new claim.
type Lease struct {
	ID    string
	Row   Locator
	Token time.Time
}

// leaseArgs splits leases into the parallel arrays that settle statements
// unnest.
func leaseArgs(leases []Lease) (tables []uint32, tids []pgtype.TID, tokens []time.Time) {
	tables, tids, tokens = make([]uint32, len(leases)), make([]pgtype.TID, len(leases)), make([]time.Time, len(leases))
	for i, l := range leases {
		tables[i], tids[i], tokens[i] = l.Row.Table, l.Row.TID, l.Token
	}
	return tables, tids, tokens
}

// leaseIDs are the leases' row ids, for a settle that finds rows by id.
func leaseIDs(leases []Lease) []string {
	ids := make([]string, len(leases))
	for i, l := range leases {
		ids[i] = l.ID
	}
	return ids
}

// settle renders one settle statement: set applies to the rows of leases
// that this drainer still holds under the same claim. args follow the
// drainer ID as $5...; perRow, when given, ride along with each lease as
// s.<name>. Each lease finds its own row (see heldUnder): a condition on all
// the ctids at once (ctid = ANY) turned the join into a comparison of every
// row with every lease, quadratic in the batch.
func (t *Table) settle(drainerID string, leases []Lease, set []string, perRow []rowValues, args ...any) Statement {
	from, where, all := t.heldUnder(drainerID, leases, perRow, args)
	return Statement{
		SQL:  fmt.Sprintf("UPDATE %s AS o SET %s\nFROM %s\nWHERE %s", t.ident, strings.Join(set, ", "), from, where),
		Args: all,
	}
}

// rowValues is one value per lease that a settle unnests beside the leases,
// as s.name of type sqlType.
type rowValues struct {
	name, sqlType string
	values        any
}

// heldUnder is what every settle shares: the leases unnested (aliased s),
// and the condition that the row (aliased o) is still held under the same
// claim: the same version, stamped by this drainer with the same token.
//
// Where an index leads with the id, the row is found through it, and the
// version is checked in a form the planner cannot turn into a TID scan. An
// index's fetch prunes the page of the versions no one can see any more (the
// claim's old ones), where a TID scan does not, so the settle's new version
// can stay on the row's page. Found by TID, it went to a new page unless a
// claim running ahead had read past the row and pruned its page: in claims
// of 30, each settled before the next, the table grew by 85 % and the drain
// wrote 792 kB of WAL per 1,000 events; found by id, the table kept its
// size and the drain wrote 540 kB.
//
// The row being unpublished is checked in a form that no partial index of
// pending rows matches: planned while the table was new and small (see
// ConnectPool), a settle read every pending row of the drainer's through
// the claim index rather than look up its own.
func (t *Table) heldUnder(drainerID string, leases []Lease, perRow []rowValues, args []any) (from, where string, all []any) {
	tables, tids, tokens := leaseArgs(leases)
	all = append([]any{tables, tids, tokens, drainerID}, args...)
	arrays, columns := "$1::oid[], $2::tid[], $3::timestamptz[]", "toid, tid, token"
	c := t.cols
	located := "o.tableoid = s.toid AND o.ctid = s.tid"
	if t.settleByID {
		perRow = append(perRow, rowValues{"id", "text", leaseIDs(leases)})
		located = fmt.Sprintf("o.%s = s.id::%s AND o.tableoid = s.toid AND (o.ctid = s.tid) IS TRUE", q(c.ID), t.idType)
	}
	for _, r := range perRow {
		all = append(all, r.values)
		arrays, columns = arrays+fmt.Sprintf(", $%d::%s[]", len(all), r.sqlType), columns+", "+r.name
	}
	from = fmt.Sprintf("unnest(%s) AS s(%s)", arrays, columns)
	fence := fmt.Sprintf("o.%s = $4 AND o.%s = s.token", q(c.ClaimedBy), q(c.ClaimedAt))
	if t.claims != "" {
		fence = t.heldInClaims()
	}
	where = fmt.Sprintf("%s\n\tAND %s AND (o.%s IS NULL) IS TRUE", located, fence, q(c.PublishedAt))
	return from, where, all
}

// MarkPublished renders the settle of confirmed rows.
func (t *Table) MarkPublished(drainerID string, leases []Lease) Statement {
	return t.settle(drainerID, leases, []string{q(t.cols.PublishedAt) + " = now()"}, nil)
}

// DeletePublished renders the settle of confirmed rows when published rows
// are not kept (retention.published 0s): fenced like every settle, it
// deletes them. A deletion writes no new row version and no index entry,
// where marking writes both; in make bench the drain cost Postgres 22 µs per
// event against 32, and a third less WAL.
func (t *Table) DeletePublished(drainerID string, leases []Lease) Statement {
	from, where, all := t.heldUnder(drainerID, leases, nil, nil)
	return Statement{SQL: fmt.Sprintf("DELETE FROM %s AS o\nUSING %s\nWHERE %s", t.ident, from, where), Args: all}
}

// FailurePolicy is what a failed attempt costs a row: the capped exponential
// delay before its next attempt, and the attempts after which it is poisoned.
type FailurePolicy struct {
	InitialMillis, MaxMillis int64
	MaxAttempts              int
}

// Failure is why one row failed, and what the far end asked of its next
// attempt.
type Failure struct {
	// Reason is stored in last_error.
	Reason string
	// RetryAfter is the least wait before the next attempt that the far end
	// asked for (a webhook's Retry-After): the row waits for the longer of
	// it and the policy's delay, and never longer than the policy's most.
	RetryAfter time.Duration
	// Poison: the far end says the row will never be taken (a webhook's
	// 410 Gone, where that poisons): the row is poisoned at once.
	Poison bool
}

// failureValues are the failures as the per-row arrays RecordFailures
// unnests.
func failureValues(failures []Failure) []rowValues {
	reasons, after, poison := make([]string, len(failures)), make([]int64, len(failures)), make([]bool, len(failures))
	for i, f := range failures {
		reasons[i], after[i], poison[i] = f.Reason, f.RetryAfter.Milliseconds(), f.Poison
	}
	return []rowValues{{"reason", "text", reasons}, {"after", "bigint", after}, {"poison", "bool", poison}}
}

// RecordFailures renders the settle of rows the broker refused or that cannot
// be published: attempts + 1, last_error, and the next due time, at
// min(max(initial × 2^attempts, the far end's Retry-After), max) from the
// database's now(), or 'infinity' once the row has used its attempts, or
// the failure poisons it: it is poisoned, and a row poisoned at once is
// given all its attempts, as the poisoned rows are counted by them. The
// exponent is capped so a long-failing row cannot overflow the interval.
func (t *Table) RecordFailures(drainerID string, leases []Lease, failures []Failure, f FailurePolicy) Statement {
	c := t.cols
	set := []string{
		fmt.Sprintf("%[1]s = CASE WHEN s.poison THEN greatest(o.%[1]s + 1, $7) ELSE o.%[1]s + 1 END", q(c.Attempts)),
		q(c.ClaimedAt) + " = NULL",
		q(c.ClaimedBy) + " = NULL",
		fmt.Sprintf(`%s = CASE WHEN s.poison OR o.%s + 1 >= $7 THEN 'infinity'::timestamptz
		ELSE now() + least(greatest($5 * interval '1 millisecond' * power(2, least(o.%s, 30)), s.after * interval '1 millisecond'),
			$6 * interval '1 millisecond') END`,
			q(c.AvailableAt), q(c.Attempts), q(c.Attempts)),
	}
	if c.LastError != "" {
		set = append(set, q(c.LastError)+" = s.reason")
	}
	return t.settle(drainerID, leases, set, failureValues(failures), f.InitialMillis, f.MaxMillis, f.MaxAttempts)
}

// Release renders the return of claims whose outcome is unknown or that were
// never published: no attempt is counted, because the row did nothing wrong.
// The row is due again at once.
func (t *Table) Release(drainerID string, leases []Lease) Statement {
	return t.settle(drainerID, leases, t.unclaim(), nil)
}

// unclaim is the assignments that give a claim back. The row is due before
// any row that was not claimed ('-infinity'): it was first in line when it
// was claimed, and a due time of now() would queue it behind every row that
// came due while it was held, in a backlog enqueued at once behind all of it.
func (t *Table) unclaim() []string {
	c := t.cols
	return []string{q(c.ClaimedAt) + " = NULL", q(c.ClaimedBy) + " = NULL", q(c.AvailableAt) + " = '-infinity'"}
}

// ReleaseHeld renders the release of every claim held under drainerID except
// those of the claims whose tokens are kept: at start-up (a restarted
// container inherits its pod name, and its predecessor's claims are no
// longer in flight), at shutdown, and after a claim whose result was lost
// (it may have committed); and by the operator, for a drainer it knows is
// dead. A claim is held for a lease from its claim time, whichever way it
// was claimed (see Claim). No index holds the claimed rows (one would make
// every claim write an entry in it), so the look-up reads the pending rows,
// through the claim index where that is cheaper than the table; it runs
// once per drainer start and stop. The rows are due first, as Release's are.
func (t *Table) ReleaseHeld(drainerID string, lease time.Duration, keep []time.Time) Statement {
	c := t.cols
	if keep == nil {
		keep = []time.Time{} // NULL would make <> ALL unknown, and release nothing
	}
	if t.claims != "" {
		return t.releaseHeldClaims(drainerID, keep)
	}
	return Statement{
		SQL: fmt.Sprintf(`UPDATE %[1]s SET %[5]s
WHERE %[3]s = $1 AND %[4]s IS NULL AND %[2]s > now() - $2 * interval '1 millisecond'
	AND %[2]s <> ALL($3::timestamptz[])`,
			t.ident, q(c.ClaimedAt), q(c.ClaimedBy), q(c.PublishedAt), strings.Join(t.unclaim(), ", ")),
		Args: []any{drainerID, lease.Milliseconds(), keep},
	}
}

// PrunePublished renders one bounded batch of retention: published rows older
// than the window. SKIP LOCKED, so drainers pruning at once share the work.
func (t *Table) PrunePublished(window time.Duration, limit int) Statement {
	return t.prune(fmt.Sprintf("%s < now() - $1 * interval '1 millisecond'", q(t.cols.PublishedAt)),
		[]any{window.Milliseconds(), limit})
}

// PruneUnpublished renders one bounded batch of dropping pending rows older
// than maxAge, by enqueued_at. A row under a live lease (see notLeased; lease
// is the fleet's) is being published right now and is left to its drainer.
func (t *Table) PruneUnpublished(maxAge, lease time.Duration, limit int) Statement {
	c := t.cols
	where := fmt.Sprintf("%s IS NULL AND %s < now() - $1 * interval '1 millisecond' AND %s",
		q(c.PublishedAt), q(c.EnqueuedAt), t.notLeased("$3"))
	if c.ParkedAt != "" {
		// A parked row was kept on purpose, for a later replay or export.
		where += " AND " + q(c.ParkedAt) + " IS NULL"
	}
	return t.prune(where, []any{maxAge.Milliseconds(), limit, lease.Milliseconds()})
}

// prune deletes at most $2 rows matching where, found again by table oid and
// ctid as the claim's rows are: by ctid alone, a partitioned outbox would
// lose rows of one partition to a prune of another.
func (t *Table) prune(where string, args []any) Statement {
	return Statement{
		SQL: fmt.Sprintf(`WITH doomed AS MATERIALIZED (
	SELECT tableoid AS toid, ctid AS tid FROM %[1]s WHERE %[2]s LIMIT $2 FOR UPDATE SKIP LOCKED
)
DELETE FROM %[1]s AS o WHERE %[3]s`, t.ident, where, locatedIn("doomed")),
		Args: args,
	}
}
