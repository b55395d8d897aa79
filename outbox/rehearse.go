package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

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

// NamedStatement is a statement and what it is, for messages.
type NamedStatement struct {
	Name string
	Statement
}

// Rehearsal renders the drainers' claim and settles under EXPLAIN, named
// claim and settle: the database plans each, checking the table, the
// columns and the privileges it needs, and runs none. So even a read-only
// transaction can rehearse them.
func (t *Table) Rehearsal(maxAttempts int) []NamedStatement {
	explain := func(name string, s Statement) NamedStatement {
		s.SQL = "EXPLAIN " + s.SQL
		return NamedStatement{Name: name, Statement: s}
	}
	const drainer = "rehearsal"
	claim := ClaimParams{DrainerID: drainer, BatchSize: 1, MaxAttempts: maxAttempts, LeaseMillis: 1, MaxPayloadBytes: 1, MaxClaimBytes: 1}
	return []NamedStatement{
		explain(StatementClaim, t.Claim(claim)),
		explain(StatementSettle, t.MarkPublished(drainer, nil)),
		explain(StatementSettle, t.RecordFailures(drainer, nil, []Failure{}, FailurePolicy{InitialMillis: 1, MaxMillis: 1, MaxAttempts: maxAttempts})),
	}
}
