package outbox

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// The statements a drainer runs, by name: what a refusal is of.
const (
	StatementClaim  = "claim"
	StatementSettle = "settle"
)

// Refusal is the database's answer to a statement it refused for a reason
// that waiting out a connection would not cure: the table renamed or
// dropped, a column gone, a privilege revoked, a full disk.
type Refusal struct {
	// SQLState is the answer's code: 42P01, 42501, …
	SQLState string
	// Text is the answer as the database gave it, with its SQLSTATE.
	Text string
}

// Refused returns the database's refusal in err, if it is one.
func Refused(err error) (Refusal, bool) {
	pg := refusal(err)
	if pg == nil {
		return Refusal{}, false
	}
	return Refusal{SQLState: pg.Code, Text: pg.Error()}, true
}

// refusal is the database's answer in err when it refused the statement for
// a reason waiting out a connection would not cure, or nil.
func refusal(err error) *pgconn.PgError {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return nil
	}
	switch {
	case strings.HasPrefix(pg.Code, "08"), // connection exception
		pg.Code == "57P01", pg.Code == "57P02", pg.Code == "57P03", // the server shutting down or starting up
		pg.Code == "53300", // too many connections
		pg.Code == readOnlySQLTransaction:
		return nil
	}
	return pg
}

// readOnlySQLTransaction is a write refused by a read-only server: a
// standby, or a primary demoted in a switchover. The cure is the new
// primary, not a fix of the statement: a connection-class failure.
const readOnlySQLTransaction = "25006"

// ReadOnly reports whether err is a write the server refused as read-only.
func ReadOnly(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == readOnlySQLTransaction
}
