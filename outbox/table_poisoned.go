package outbox

import (
	"fmt"
	"strconv"
	"strings"
)

// This file holds the statements of the poisoned rows' triage: listing
// them, and replaying or parking them (poisoned.go runs them).

// poisonedScope renders the rows r's selector picks, its arguments appended
// to args: pending rows that are poisoned (attempts >= the fleet's
// maxAttempts, or due at 'infinity', as the claim and the status define it)
// and not parked, or, with Parked, the parked rows. A row under a live lease
// (see notLeased) is never in scope: a drainer is publishing it right now.
// The selector's criteria narrow the scope, never widen it, so no selector
// reaches a published or a healthy pending row.
func (t *Table) poisonedScope(r PoisonedRequest, args []any) (string, []any) {
	c, sel := t.cols, r.Selector
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	where := []string{
		q(c.PublishedAt) + " IS NULL",
		t.notLeased(arg(r.Lease.Milliseconds())),
	}
	if sel.Parked {
		where = append(where, q(c.ParkedAt)+" IS NOT NULL")
	} else {
		if c.ParkedAt != "" {
			where = append(where, q(c.ParkedAt)+" IS NULL")
		}
		where = append(where, fmt.Sprintf("(%s >= %s OR %s = 'infinity')", q(c.Attempts), arg(r.MaxAttempts), q(c.AvailableAt)))
	}
	if len(sel.IDs) > 0 {
		// Cast from text, so one statement serves every id type; the ids
		// were checked against the column's type first.
		where = append(where, fmt.Sprintf("%s = ANY(%s::text[]::%s[])", q(c.ID), arg(sel.IDs), t.idType))
	}
	if sel.LastErrorPattern != "" {
		where = append(where, fmt.Sprintf("%s LIKE %s", q(c.LastError), arg(sel.LastErrorPattern)))
	}
	if sel.EnqueuedSince != nil {
		where = append(where, fmt.Sprintf("%s >= %s", q(c.EnqueuedAt), arg(*sel.EnqueuedSince)))
	}
	if sel.EnqueuedBefore != nil {
		where = append(where, fmt.Sprintf("%s < %s", q(c.EnqueuedAt), arg(*sel.EnqueuedBefore)))
	}
	return strings.Join(where, " AND "), args
}

// poisonedOrder is the order rows are listed and taken in: oldest first, so
// that a limit takes the same rows a dry run listed.
func (t *Table) poisonedOrder() string {
	if t.cols.EnqueuedAt != "" {
		return q(t.cols.EnqueuedAt) + ", " + q(t.cols.ID)
	}
	return q(t.cols.ID)
}

// SelectPoisoned renders the listing of the rows r picks, at most its
// limit, oldest first: id, attempts, enqueued at, the last error cut at
// maxCauseChars characters, and when the row was parked.
func (t *Table) SelectPoisoned(r PoisonedRequest) Statement {
	c := t.cols
	scope, args := t.poisonedScope(r, nil)
	enqueuedAt, lastError, parkedAt := "NULL::timestamptz", "NULL::text", "NULL::timestamptz"
	if c.EnqueuedAt != "" {
		enqueuedAt = q(c.EnqueuedAt)
	}
	if c.LastError != "" {
		lastError = "substr(" + q(c.LastError) + ", 1, " + strconv.Itoa(maxCauseChars) + ")"
	}
	if c.ParkedAt != "" {
		parkedAt = q(c.ParkedAt)
	}
	args = append(args, r.Selector.Limit)
	return Statement{
		SQL: fmt.Sprintf("SELECT %s::text, %s, %s, %s, %s\nFROM %s\nWHERE %s\nORDER BY %s\nLIMIT $%d",
			q(c.ID), q(c.Attempts), enqueuedAt, lastError, parkedAt, t.ident, scope, t.poisonedOrder(), len(args)),
		Args: args,
	}
}

// CountPoisoned renders the count of the rows r picks, up to its limit.
func (t *Table) CountPoisoned(r PoisonedRequest) Statement {
	scope, args := t.poisonedScope(r, nil)
	args = append(args, r.Selector.Limit)
	return Statement{
		SQL:  fmt.Sprintf("SELECT count(*) FROM (SELECT 1 FROM %s WHERE %s LIMIT $%d) matched", t.ident, scope, len(args)),
		Args: args,
	}
}

// ReplayPoisoned renders one batch of a replay: up to batch rows that sel
// picks get their attempts, last error and lease reset, and go back to their
// places in line (dueInLine), so the fleet publishes them again in the
// order they were enqueued; a parked row is unparked.
func (t *Table) ReplayPoisoned(r PoisonedRequest, batch int) Statement {
	c := t.cols
	set := []string{
		q(c.Attempts) + " = 0",
		q(c.AvailableAt) + " = " + t.dueInLine("o"),
		q(c.ClaimedAt) + " = NULL",
		q(c.ClaimedBy) + " = NULL",
	}
	if c.LastError != "" {
		set = append(set, q(c.LastError)+" = NULL")
	}
	if c.ParkedAt != "" {
		set = append(set, q(c.ParkedAt)+" = NULL")
	}
	return t.changePoisoned(r, batch, set)
}

// ParkPoisoned renders one batch of parking: up to batch rows that sel
// picks are stamped parked_at and due at 'infinity', so no claim reaches
// them and the status counts them apart; attempts and last error stay, for
// whoever looks at them later.
func (t *Table) ParkPoisoned(r PoisonedRequest, batch int) Statement {
	c := t.cols
	return t.changePoisoned(r, batch, []string{
		q(c.ParkedAt) + " = now()",
		q(c.AvailableAt) + " = 'infinity'",
		q(c.ClaimedAt) + " = NULL",
		q(c.ClaimedBy) + " = NULL",
	})
}

// changePoisoned renders one bounded batch that applies set to the rows sel
// picks, as one statement: the rows are locked SKIP LOCKED (a row a drainer
// or the application holds is left alone, never waited for) and found again
// by table oid and ctid, as the claim's and the prune's are, so a
// partitioned outbox changes no row of another partition. Clearing the
// lease also voids any settle still in flight for an expired one: settles
// are fenced on claimed_by and claimed_at. It returns the ids it changed.
func (t *Table) changePoisoned(r PoisonedRequest, batch int, set []string) Statement {
	scope, args := t.poisonedScope(r, nil)
	args = append(args, batch)
	return Statement{
		SQL: fmt.Sprintf(`WITH picked AS MATERIALIZED (
	SELECT tableoid AS toid, ctid AS tid FROM %[1]s
	WHERE %[2]s
	ORDER BY %[3]s
	LIMIT $%[4]d
	FOR UPDATE SKIP LOCKED
)
UPDATE %[1]s AS o SET %[5]s
WHERE %[6]s
RETURNING o.%[7]s::text`,
			t.ident, scope, t.poisonedOrder(), len(args), strings.Join(set, ", "), locatedIn("picked"), q(t.cols.ID)),
		Args: args,
	}
}
