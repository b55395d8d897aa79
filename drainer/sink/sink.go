// Package sink is the contract between the drainer's engine and where it
// publishes rows: a RabbitMQ broker today (package rabbitmq), a webhook
// next. The engine claims rows, hands each to a Sink, and settles each as
// the Sink's outcome says; a sink knows its transport and nothing of the
// outbox's table or leases.
//
// Every outcome is one of three: the row went (Confirmed); the row is at
// fault (a RowFault before sending, or Refused after), which counts an
// attempt; or the outcome is unknown or the far end is pushing back (Lost,
// PushedBack, a delivery given up, ErrDown), which releases the row with
// no attempt counted: a duplicate is possible, a loss is not.
package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spillway-io/spillway/outbox"
)

// Dialer opens a sink's connections, as its configuration says.
type Dialer interface {
	// Dial opens a connection. It reads its settings afresh, so a rotated
	// password takes effect here. changed is called when the connection
	// fails or is blocked or unblocked. Once hardStop ends, nothing on the
	// connection outlives it, not even a write blocked on a full socket.
	Dial(hardStop context.Context, changed func()) (Sink, error)
	// Watch calls changed when the connection's settings change (a rotated
	// Secret's file), until ctx ends.
	Watch(ctx context.Context, log *slog.Logger, changed func()) error
	// Where is where the sink publishes, for a log line: no secret.
	Where() string
	// Span is how its publishes appear as spans, when tracing is on.
	Span() SpanShape
}

// Sink is one open connection. One goroutine publishes on it and resolves
// its deliveries; Healthy and Blocked may be asked from any.
type Sink interface {
	// Prepare turns a row into what Publish sends, with tc as its trace
	// context, or says why the row cannot be sent, before anything is: the
	// row's fault.
	Prepare(row outbox.Row, tc Trace) (Message, *RowFault)
	// Publish sends m, or holds it back with the publishes before it until
	// Flush. An error means m was not sent: one that wraps ErrDown is the
	// connection's; any other is m's own, which made the sink close the
	// connection.
	Publish(ctx context.Context, m Message) (Delivery, error)
	// Flush sends what Publish held back.
	Flush()
	// Healthy is false once the connection has failed: its deliveries
	// resolve as Lost.
	Healthy() bool
	// Blocked is true while the far end refuses publishes for now (a
	// resource alarm): a delivery then waits.
	Blocked() bool
	// Stale is true once a delivery was given up on the connection while it
	// was blocked: the connection is kept while it stays blocked (a new one
	// would block too), and replaced after.
	Stale() bool
	// Close closes the connection, waiting a moment at most.
	Close()
}

// Message is a row as a sink sends it.
type Message interface {
	// Size is the payload's bytes, counted against the engine's budget of
	// bytes in flight.
	Size() int64
}

// Delivery is one message on its way, until its outcome.
type Delivery interface {
	// Done is closed once the outcome is known.
	Done() <-chan struct{}
	// Outcome is the outcome, once Done is closed.
	Outcome() Outcome
	// GiveUp abandons a delivery whose outcome did not come: before its
	// deadline (timedOut) or before shutdown. A late outcome is then never
	// taken for a later delivery's.
	GiveUp(timedOut bool)
}

// Kind is what became of a delivery.
type Kind int

const (
	// Confirmed: the far end took the message.
	Confirmed Kind = iota
	// Refused: the far end took the message but says the row is at fault
	// (a broker's return of an unroutable message): an attempt counts.
	Refused
	// PushedBack: the far end refused the message for now (a broker's
	// nack, a full queue): released, and claiming backs off.
	PushedBack
	// Lost: the connection failed before the outcome came: released.
	Lost
)

// Outcome is a delivery's outcome.
type Outcome struct {
	Kind Kind
	// Reason is a metric label, for Refused.
	Reason string
	// Detail says why, for Refused (stored in last_error) and Lost.
	Detail string
	// RetryAfter, for Refused, is the least wait the far end asked for
	// before the row is sent again (an HTTP Retry-After).
	RetryAfter time.Duration
	// Poison, for Refused: the far end says the row will never be taken
	// (an HTTP 410 Gone, where the sink is set to poison on it).
	Poison bool
}

// RowFault is why a row cannot be sent: its own fault, which counts an
// attempt, and enough of them poison the row.
type RowFault struct {
	// Reason is a metric label.
	Reason string
	// Detail is stored in last_error.
	Detail string
}

func (f *RowFault) Error() string { return f.Detail }

// ReasonOversized is the failure reason of a row whose payload is over the
// size limit.
const ReasonOversized = "oversized"

// Oversized is the fault of a row whose payload was not loaded because it is
// over limit, the drainer's maxPayloadBytes; nil for any other row.
func Oversized(row outbox.Row, limit int64) *RowFault {
	if row.Payload != nil {
		return nil
	}
	return &RowFault{Reason: ReasonOversized, Detail: fmt.Sprintf("payload is %d bytes, over the %d-byte limit (maxPayloadBytes)", row.Size, limit)}
}

// ErrDown marks a publish that failed because the connection did.
var ErrDown = errors.New("the sink's connection is down")

// ContentType is a message's content type by the payload column's type.
func ContentType(payloadType string) string {
	switch payloadType {
	case "jsonb", "json":
		return "application/json"
	case "text":
		return "text/plain; charset=utf-8"
	default:
		return "application/octet-stream"
	}
}
