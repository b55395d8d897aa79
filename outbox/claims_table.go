package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// A lease kept outside the row: issue 48's direction, measured by make
// bench's design section beside today's claim. Nothing else runs it.
//
// Each claim is one row of a claims table beside the outbox (its name with
// _claims): the drainer, the claim's time as its token, and the ids it holds.
// The claim writes nothing into the outbox's rows, so a published row costs
// its insert and its settle's delete only. How it keeps the contract's
// promises (docs/benchmark-notes.md says why it is not the default):
//   - claims of a table are serialized by an advisory lock (claimLock): a
//     row lock alone would not keep a second claim, whose snapshot predates
//     the first's commit, off the first's rows;
//   - a settle is fenced on its claim's row: while it exists, the claim
//     holds every id in it, and a claim past its lease is deleted by the
//     next claim, which may then take its rows;
//   - a dead drainer's rows wait for their lease to pass: no one releases
//     them early (ReleaseHeld releases a live drainer's own);
//   - ordered tables keep their lease in the due time, and are refused.

// claimsSuffix names a table's claims table.
const claimsSuffix = "_claims"

// KeepLeasesInClaimsTable makes the store's claims and settles keep their
// leases in the table's claims table, which it creates if missing. A
// claim's ids are stored uncompressed: uuids barely compress, and trying
// cost 0.4 µs a row.
func (s *Store) KeepLeasesInClaimsTable(ctx context.Context) error {
	t := s.table
	if t.Ordered() {
		return errors.New("an ordered table keeps its leases in the due time")
	}
	// The quoted name with the suffix inside its closing quote.
	claims := strings.TrimSuffix(t.ident, `"`) + claimsSuffix + `"`
	if _, err := s.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
	drainer text NOT NULL,
	claimed_at timestamptz NOT NULL,
	ids %[2]s[] NOT NULL,
	PRIMARY KEY (drainer, claimed_at)
);
ALTER TABLE %[1]s ALTER ids SET STORAGE EXTERNAL`, claims, t.idType)); err != nil {
		return fmt.Errorf("create the claims table of %s: %w", t.name, err)
	}
	t.claims = claims
	return nil
}

// claimLock serializes the claims of one table (see claimOutsideRow): taken
// in the claim's transaction before the claim, whose snapshot then sees
// every earlier claim's row.
func (t *Table) claimLock() Statement {
	return Statement{SQL: "SELECT pg_advisory_xact_lock(hashtext($1))", Args: []any{t.claims}}
}

// claimOutsideRow renders the claim of a table whose leases are kept in its
// claims table: the live due rows that no live claim holds, within the byte
// budget as Claim's are, recorded as one row of the claims table, which is
// the only write. A claim past its lease is deleted, and its rows are due
// again for this one. The rows are read, not locked: claimLock keeps other
// claims off them, and a settle or a change by hand meanwhile is settled by
// the fences (see heldUnder), as with Claim.
//
// With no update to find the rows again, live carries every column the
// drainer receives, and the rows within the budget, always the first ones
// in due order, are matched to taken by their place in it.
func (t *Table) claimOutsideRow(p ClaimParams) Statement {
	args, terms := t.claimTerms(p)
	terms = append(terms, t.claims, t.traceContext("o"))
	sql := fmt.Sprintf(`WITH RECURSIVE held AS (
	SELECT unnest(ids) AS id FROM %[14]s WHERE claimed_at > now() - $4 * interval '1 millisecond'
),
live AS MATERIALIZED (
	SELECT o.tableoid AS toid, o.ctid AS tid, o.%[3]s AS due_at, %[13]s AS size, o.%[2]s AS id, o.%[9]s AS payload,
		%[10]s AS routing_key, %[11]s AS headers, %[12]s AS enqueued_at, %[15]s
	FROM %[1]s AS o
	WHERE o.%[5]s IS NULL AND o.%[3]s <= now() AND %[4]s AND o.%[2]s NOT IN (SELECT id FROM held)
	ORDER BY o.%[3]s
	LIMIT $2
),
`+claimBudget+`,
claimed AS MATERIALIZED (
	SELECT l.id, l.toid, l.tid, CASE WHEN k.size <= $5 THEN l.payload END AS payload, k.size, l.routing_key, l.headers,
		l.enqueued_at, k.n, l.trace_parent, l.trace_state
	FROM (SELECT live.*, row_number() OVER (ORDER BY due_at, tid) AS place FROM live) l JOIN taken k ON k.n = l.place
),
expired AS (
	DELETE FROM %[14]s WHERE claimed_at <= now() - $4 * interval '1 millisecond'
),
lease AS (
	INSERT INTO %[14]s (drainer, claimed_at, ids) SELECT $1, now(), array_agg(id) FROM claimed HAVING count(*) > 0
)
SELECT id::text, toid, tid, now(), payload, size, routing_key, headers, enqueued_at, n, (SELECT count(*) FROM live), trace_parent, trace_state
FROM claimed`, terms...)
	return Statement{SQL: sql, Args: args}
}

// heldInClaims is heldUnder's fence for leases kept in the claims table:
// the lease's claim still has its row. A claim's ids never change, so its
// row's being there is enough, with no look through them.
func (t *Table) heldInClaims() string {
	return fmt.Sprintf("s.token IN (SELECT c.claimed_at FROM %s c WHERE c.drainer = $4)", t.claims)
}

// endClaims renders the deletion of the claims of the settled leases, after
// their rows' settles, in the same transaction: every row of a claim is
// settled together.
func (t *Table) endClaims(drainerID string, leases []Lease) Statement {
	tokens := make([]time.Time, 0, 1)
	for _, l := range leases {
		if len(tokens) == 0 || !tokens[len(tokens)-1].Equal(l.Token) {
			tokens = append(tokens, l.Token)
		}
	}
	return Statement{
		SQL:  fmt.Sprintf("DELETE FROM %s WHERE drainer = $1 AND claimed_at = ANY($2::timestamptz[])", t.claims),
		Args: []any{drainerID, tokens},
	}
}

// releaseHeldClaims is ReleaseHeld for leases kept in the claims table.
func (t *Table) releaseHeldClaims(drainerID string, keep []time.Time) Statement {
	return Statement{
		SQL:  fmt.Sprintf("DELETE FROM %s WHERE drainer = $1 AND claimed_at <> ALL($2::timestamptz[])", t.claims),
		Args: []any{drainerID, keep},
	}
}
