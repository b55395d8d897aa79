package drainer

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/spillway-io/spillway/outbox"
)

// A drainer whose claims or settles keep failing on the database's own
// answer (the table renamed or dropped, a column gone, a privilege revoked,
// a full disk) cannot drain however long it retries: after refusalsToUnready
// such failures in a row it reports itself unready, with the answer, until
// the statement succeeds again. A lost connection is not such an answer:
// Ready's ping speaks for the database itself, and the cure is to wait. Nor
// is a write the server refused as read-only (a primary demoted by a
// failover): the cure is the new primary, and the drainer is unready, saying
// so, from the first such failure until a statement succeeds.

// refusalsToUnready is how many refusals in a row of one statement make the
// drainer unready.
const refusalsToUnready = 3

// The statements whose refusals make the drainer unready, as metric labels.
const (
	statementClaim  = outbox.StatementClaim
	statementSettle = outbox.StatementSettle
	// statementRelease is the release of a previous process's claims, at
	// start, before the first claim.
	statementRelease = "release"
)

// refusals are the failures in a row of each watched statement.
type refusals struct {
	table   string
	metrics *Metrics
	mu      sync.Mutex
	streaks map[string]*failureStreak
}

// failureStreak is one statement's failures since its last success.
type failureStreak struct {
	// tries counts every failure; refused, the refusals among the latest.
	tries, refused int
	// answer is the last refusal, while refused counts it.
	answer outbox.Refusal
	// readOnly is the last failure's text when the server answered it
	// read-only: not a refusal, but the drainer cannot drain there.
	readOnly      string
	since, logged time.Time
}

func newRefusals(table string, metrics *Metrics) *refusals {
	return &refusals{table: table, metrics: metrics, streaks: map[string]*failureStreak{}}
}

// failed records a failure of statement. It returns the streak as it now
// stands, and whether the failure is worth a log line: the first of a
// streak, the one that makes the drainer unready, and then one a minute.
func (r *refusals) failed(statement string, err error, now time.Time) (streak failureStreak, log bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.streaks[statement]
	if s == nil {
		s = &failureStreak{since: now}
		r.streaks[statement] = s
	}
	wasUnready := s.refused >= refusalsToUnready
	s.tries++
	answer, refused := outbox.Refused(err)
	r.metrics.StatementErrors.WithLabelValues(statement, sqlState(answer, refused)).Inc()
	if refused {
		s.refused++
	} else {
		s.refused = 0
	}
	if wasUnready {
		r.metrics.StatementFailing.DeleteLabelValues(statement, s.answer.SQLState)
	}
	s.answer = answer
	s.readOnly = ""
	if outbox.ReadOnly(err) {
		s.readOnly = err.Error()
	}
	if s.refused >= refusalsToUnready {
		r.metrics.StatementFailing.WithLabelValues(statement, answer.SQLState).Set(1)
	}
	log = s.tries == 1 || (s.refused == refusalsToUnready) || now.Sub(s.logged) >= time.Minute
	if log {
		s.logged = now
	}
	return *s, log
}

// succeeded ends statement's streak, and returns it.
func (r *refusals) succeeded(statement string) failureStreak {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.streaks[statement]
	if s == nil {
		return failureStreak{}
	}
	if s.refused >= refusalsToUnready {
		r.metrics.StatementFailing.DeleteLabelValues(statement, s.answer.SQLState)
	}
	delete(r.streaks, statement)
	return *s
}

// cause says why the drainer is unready for its statements, or nil.
func (r *refusals) cause() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var causes []string
	for _, statement := range []string{statementRelease, statementClaim, statementSettle} {
		switch s := r.streaks[statement]; {
		case s == nil:
		case s.refused >= refusalsToUnready:
			causes = append(causes, fmt.Sprintf("%ss on %s fail: %s; %d tries in a row since %s", statement, r.table, s.answer.Text, s.tries,
				s.since.UTC().Format(time.RFC3339)))
		case s.readOnly != "":
			causes = append(causes, fmt.Sprintf("%ss on %s fail: the server is read-only, a standby or a primary demoted by a failover (%s); reconnecting to find the primary",
				statement, r.table, s.readOnly))
		}
	}
	if len(causes) == 0 {
		return nil
	}
	return errors.New(strings.Join(causes, "; "))
}

// statementFailed records a failed claim or settle, and logs the first
// failure of a streak, the one that makes the drainer unready, and then one
// a minute, rather than every try.
func (d *Drainer) statementFailed(statement string, err error) {
	streak, log := d.refusals.failed(statement, err, time.Now())
	switch {
	case !log:
	case streak.refused == refusalsToUnready:
		d.log.Error("The database keeps refusing "+statement+"s; the drainer reports itself unready until one succeeds",
			"error", err, "tries", streak.tries)
	default:
		d.log.Error(strings.ToUpper(statement[:1])+statement[1:]+" failed", "error", err, "tries", streak.tries)
	}
}

// statementSucceeded ends a streak of failures of a claim or settle.
func (d *Drainer) statementSucceeded(statement string) {
	if streak := d.refusals.succeeded(statement); streak.refused >= refusalsToUnready {
		d.log.Info(strings.ToUpper(statement[:1])+statement[1:]+"s succeed again; the drainer is ready",
			"failedTries", streak.tries, "failingFor", time.Since(streak.since).Round(time.Millisecond))
	}
}

// sqlState is the SQLSTATE of a refusal, and "connection" for any other
// failure.
func sqlState(answer outbox.Refusal, refused bool) string {
	if !refused {
		return "connection"
	}
	return answer.SQLState
}
