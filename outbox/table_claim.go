package outbox

import (
	"fmt"
	"strings"
	"time"
)

// The statements of phase 1, the claim, and of the shelving of the spent
// rows claims pass over.

// ClaimParams are the knobs of one claim.
type ClaimParams struct {
	DrainerID       string
	BatchSize       int
	MaxAttempts     int
	LeaseMillis     int64
	MaxPayloadBytes int64
	// MaxClaimBytes is the claim's byte budget: it stops adding rows at the
	// first whose payload would take it over, so a row larger than the
	// budget is claimed alone.
	MaxClaimBytes int64
	// LeaseInDueTime claims as Spillway did before its claims became
	// heap-only: the lease is also written into the due time, moving the
	// row's claim index entry. make bench runs it beside today's claim, to
	// compare what each costs the database; nothing else sets it.
	LeaseInDueTime bool
}

// stampLease is the assignments of a claim's update: the drainer and the
// claim's time, and with inDueTime (an ordered table's claim, or the
// earlier design) the due time a lease ahead.
func (t *Table) stampLease(inDueTime bool) []string {
	c := t.cols
	set := []string{q(c.ClaimedAt) + " = now()", q(c.ClaimedBy) + " = $1"}
	if inDueTime {
		set = append(set, q(c.AvailableAt)+" = now() + $4 * interval '1 millisecond'")
	}
	return set
}

// notLeased is the condition that a row (unqualified) is under no live
// lease, lease being the parameter that holds the fleet's lease in
// milliseconds: it was never claimed or was given back (claimed_at is
// cleared by every settle that keeps it), or its claim is over: a lease has
// passed since it was claimed, and it is due, as a row whose lease was
// written into its due time (see Claim) is only once that lease ends.
func (t *Table) notLeased(lease string) string {
	c := t.cols
	return fmt.Sprintf("(%[1]s IS NULL OR (%[2]s <= now() AND %[1]s <= now() - %[3]s * interval '1 millisecond'))",
		q(c.ClaimedAt), q(c.AvailableAt), lease)
}

// Claim renders phase 1. Every row carries its due time in available_at: a
// fresh row is due when it is enqueued, a row in backoff when its backoff
// ends, a poisoned row never ('infinity'). The claim takes live due rows that
// no live lease holds, in due order, so a retried row waits only behind rows
// that were due before it, whatever the fresh backlog. Through the claim
// index on (available_at) over pending rows it reads only due rows: rows in
// backoff, poisoned rows and published history all lie past now() or
// outside the index, so a claim costs O(batch) however many of them pile up.
//
// The claim writes only the lease, claimed_by and claimed_at, which no index
// of the table's holds: on a table with room on its pages (migrate's leaves
// half of each free), its update is heap-only, writing no index entry, where
// moving the due time a lease ahead, as the claim once did, wrote one in the
// claim index and one in the primary key. In make bench that was 144 of the
// 586 bytes of WAL each event cost. A row in flight therefore stays due in
// the index, and the claim tells it from a free one by its claim time (see
// notLeased): it passes over the rows in flight, a pipeline's worth per
// drainer, as it reads. An ordered table keeps the lease in the due time
// (see claimInOrder), and rows so leased are due only when it ends.
//
// A due row that is not live (at maxAttempts with a finite due time: an
// adopted table's poisoned rows, a lowered maxAttempts, a row set back by
// hand; or a parked row made due by hand) is passed over, never locked:
// taking such rows out of line a batch per claim kept the live rows behind
// a million of them waiting for two thousand claims. They cost the claim a
// look each until ShelveSpent gives them the due time they should have.
//
// The statement, step by step:
//   - live: up to a batch of live due rows under no lease, locked, in due
//     order.
//   - the budget: those rows in due order, adding each payload's size, up
//     to the first row that would take the claim over its byte budget; the
//     first row is always taken. A payload that is cheap to size (a text or
//     bytea, or a JSON payload stored in under 2 kB) is sized as it is
//     found; when every row was, the budget is a running sum. Otherwise a
//     walk sizes each row only as it reaches it, so a large backlog of large
//     payloads costs one row each.
//   - taken: the rows within the budget, with their sizes and their places
//     in due order. The rest stay unclaimed and are unlocked at commit.
//   - the update stamps the lease; claimed_by names the drainer and
//     claimed_at, the claim's transaction time, is the claim's token: every
//     settle is fenced on both.
//
// Rows are found again by table oid and ctid, which cannot change while the
// row lock is held: one TID scan, not a primary-key probe per row. A ctid
// names a row only within one table, and a partition or an inheriting child
// numbers its own, so the oid goes with it.
//
// A payload over the size limit comes back as NULL with its size, so an
// oversized row is never loaded into memory; it counts nothing against the
// budget.
//
// Each row returns its place in due order, since an update returns its rows
// in the order it found them (by ctid, which follows where each row landed in
// the table, not when it came due), and the number of live rows that were
// due, so the drainer can tell a claim cut short by its budget from an
// outbox with nothing more due.
func (t *Table) Claim(p ClaimParams) Statement {
	if t.order != nil {
		return t.claimInOrder(p)
	}
	if t.claims != "" {
		return t.claimOutsideRow(p)
	}
	args, terms := t.claimTerms(p)
	terms = append(terms, t.notLeased("$4"), strings.Join(t.stampLease(p.LeaseInDueTime), ", "), t.traceContext("o"))
	sql := fmt.Sprintf(`WITH RECURSIVE live AS MATERIALIZED (
	SELECT tableoid AS toid, ctid AS tid, %[3]s AS due_at, %[13]s AS size
	FROM %[1]s
	WHERE %[5]s IS NULL AND %[3]s <= now() AND %[4]s AND %[14]s
	ORDER BY %[3]s
	LIMIT $2
	FOR UPDATE SKIP LOCKED
),
`+claimBudget+`
UPDATE %[1]s AS o SET %[15]s
FROM taken k
WHERE `+takenRows+`
RETURNING o.%[2]s::text, o.tableoid, o.ctid, o.%[7]s, CASE WHEN k.size <= $5 THEN o.%[9]s END, k.size, %[10]s, %[11]s, %[12]s,
	k.n, (SELECT count(*) FROM live), %[16]s`, terms...)
	return Statement{SQL: sql, Args: args}
}

// claimBudget is the part of the claim that sizes the live due rows and
// keeps those within the byte budget (see Claim): from live, the rows the
// claim may take in due order, it makes taken. It takes the claim's format
// arguments. The walk's lateral stays a subquery (OFFSET 0): pulled up, its
// size became five subplans, each set up by every claim, walking or not.
const claimBudget = `sized AS (
	SELECT toid, tid, size, n FROM (
		SELECT toid, tid, size, row_number() OVER w AS n, sum(CASE WHEN size <= $5 THEN size ELSE 0 END) OVER w AS bytes
		FROM live
		WINDOW w AS (ORDER BY due_at, tid)
	) s
	WHERE n = 1 OR bytes <= $6
),
queue AS MATERIALIZED (
	SELECT array_agg(toid ORDER BY due_at, tid) AS toids, array_agg(tid ORDER BY due_at, tid) AS tids,
		array_agg(size ORDER BY due_at, tid) AS sizes
	FROM live
),
budget(n, bytes, size) AS (
	SELECT 0, 0::bigint, 0::bigint
	UNION ALL
	SELECT b.n + 1, b.bytes + CASE WHEN r.size <= $5 THEN r.size ELSE 0 END, r.size
	FROM budget b, queue q, LATERAL (
		SELECT coalesce(q.sizes[b.n + 1],
			(SELECT %[6]s FROM %[1]s o WHERE o.tableoid = q.toids[b.n + 1] AND o.ctid = q.tids[b.n + 1])) AS size
		OFFSET 0
	) r
	WHERE b.n < cardinality(q.tids) AND (b.n = 0 OR b.bytes + CASE WHEN r.size <= $5 THEN r.size ELSE 0 END <= $6)
),
taken AS (
	SELECT toid, tid, size, n FROM sized WHERE (SELECT coalesce(bool_and(size IS NOT NULL), true) FROM live)
	UNION ALL
	SELECT q.toids[b.n], q.tids[b.n], b.size, b.n FROM budget b, queue q
	WHERE b.n > 0 AND NOT (SELECT coalesce(bool_and(size IS NOT NULL), true) FROM live)
)`

// takenRows is how a claim's update finds the rows it takes (alias o) in
// taken (alias k): all in one TID scan, matched to taken by a hash join.
// Compared as tids, the ctids let a session that planned the claim while
// few rows were due look each row up in a TID scan of its own, filtered by
// the whole list: quadratic in the claim, and a quarter of the Postgres CPU
// of a claim of 500 rows once a backlog built up. As text, they can only be
// hashed or sorted. The other lists found again by ctid (see locatedIn)
// keep comparing tids: the planner expects a row or so in them, and would
// nest a scan of every listed ctid inside each.
const takenRows = "o.ctid = ANY(ARRAY(SELECT tid FROM taken)) AND o.tableoid = k.toid AND o.ctid::text = k.tid::text"

// claimTerms are the claim's arguments, and its format arguments: 1 the
// table, 2 id, 3 due time, 4 live, 5 published at, 6 a payload's size, 7
// claimed at, 8 claimed by, 9 payload, 10 routing key, 11 headers, 12
// enqueued at, 13 the cheap size.
func (t *Table) claimTerms(p ClaimParams) (args, terms []any) {
	c := t.cols
	args = []any{p.DrainerID, p.BatchSize, p.MaxAttempts, p.LeaseMillis, p.MaxPayloadBytes, p.MaxClaimBytes}
	routingKey := "o." + q(t.routingKey.Column) + "::text"
	switch {
	case t.routingKey.PayloadField != "":
		args = append(args, t.routingKey.PayloadField)
		routingKey = "o." + q(c.Payload) + " ->> $7::text"
	case t.routingKey.Constant != "":
		args = append(args, t.routingKey.Constant)
		routingKey = "$7::text"
	}
	headers, enqueued := "NULL::jsonb", "now()"
	if c.Headers != "" {
		headers = "o." + q(c.Headers) + "::jsonb"
	}
	if c.EnqueuedAt != "" {
		enqueued = "o." + q(c.EnqueuedAt)
	}
	return args, []any{t.ident, q(c.ID), q(c.AvailableAt), t.live("$3"), q(c.PublishedAt), t.payloadSize("o"),
		q(c.ClaimedAt), q(c.ClaimedBy), q(c.Payload), routingKey, headers, enqueued, t.cheapPayloadSize()}
}

// live is the condition that a pending row (unqualified) may be claimed
// when it is due: it has attempts left, maxAttempts being the parameter
// maxAttempts, and it is not parked. A parked row is due at 'infinity' and
// never reaches a claim; one made due by hand is still not published.
func (t *Table) live(maxAttempts string) string {
	live := q(t.cols.Attempts) + " < " + maxAttempts
	if t.cols.ParkedAt != "" {
		live += " AND " + q(t.cols.ParkedAt) + " IS NULL"
	}
	return live
}

// ShelveSpent renders one bounded batch of the shelving of spent rows: due
// rows that are not live (see Claim) get the due time 'infinity', the one a
// failure at maxAttempts gives, so that claims no longer pass over them. A
// parked row keeps its parked_at, and with it its place out of the
// poisoned count. Rows are taken in due order, the oldest first, as claims
// meet them. A row in flight is left to its drainer's settle, lease being
// the fleet's.
func (t *Table) ShelveSpent(maxAttempts int, lease time.Duration, limit int) Statement {
	c := t.cols
	return Statement{
		SQL: fmt.Sprintf(`WITH spent AS MATERIALIZED (
	SELECT tableoid AS toid, ctid AS tid FROM %[1]s
	WHERE %[2]s IS NULL AND %[3]s <= now() AND NOT (%[4]s) AND %[8]s
	ORDER BY %[3]s
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)
UPDATE %[1]s AS o SET %[3]s = 'infinity', %[5]s = NULL, %[6]s = NULL WHERE %[7]s`,
			t.ident, q(c.PublishedAt), q(c.AvailableAt), t.live("$1"), q(c.ClaimedAt), q(c.ClaimedBy), locatedIn("spent"), t.notLeased("$3")),
		Args: []any{maxAttempts, limit, lease.Milliseconds()},
	}
}

// traceContext is the trace context columns of the row aliased alias, as
// text named trace_parent and trace_state, NULL where the table lacks one.
func (t *Table) traceContext(alias string) string {
	column := func(name, as string) string {
		if name == "" {
			return "NULL::text AS " + as
		}
		return alias + "." + q(name) + "::text AS " + as
	}
	return column(t.cols.TraceParent, "trace_parent") + ", " + column(t.cols.TraceState, "trace_state")
}

// payloadSize is the size of the payload of the row aliased alias as the
// drainer receives it: a JSON payload as its text.
func (t *Table) payloadSize(alias string) string {
	payload := alias + "." + q(t.cols.Payload)
	if t.isJSON() {
		return "octet_length(" + payload + "::text)"
	}
	return "octet_length(" + payload + ")"
}

// cheapPayloadSize is the payload's size where it costs little to know, and
// NULL where it does not: a text or bytea knows its length without being
// read, but a JSON payload is sized by writing it out as text, which for a
// large one is more work than its claim, so only one stored in under 2 kB is.
func (t *Table) cheapPayloadSize() string {
	payload := q(t.cols.Payload)
	if t.isJSON() {
		return "CASE WHEN pg_column_size(" + payload + ") < 2048 THEN octet_length(" + payload + "::text) END"
	}
	return "octet_length(" + payload + ")"
}

func (t *Table) isJSON() bool { return t.payloadType == "jsonb" || t.payloadType == "json" }

// dueInLine is the due time a row, aliased alias, gets when it goes back in
// line (a waiting row whose turn came, a replayed row): its enqueued_at, so
// that it queues among the other rows by age, where rows made due at one
// now() would tie and go out in the order of their places in the table. A
// table or a row without enqueued_at has no place to go back to: now().
func (t *Table) dueInLine(alias string) string {
	if t.cols.EnqueuedAt == "" {
		return "now()"
	}
	return "coalesce(" + alias + "." + q(t.cols.EnqueuedAt) + ", now())"
}

// locatedIn matches the target rows (alias o) whose table oid and ctid are
// listed by a query over from, which selects toid and tid.
func locatedIn(from string) string {
	return fmt.Sprintf("o.ctid = ANY(ARRAY(SELECT tid FROM %[1]s)) AND (o.tableoid, o.ctid) IN (SELECT toid, tid FROM %[1]s)", from)
}
