package outbox

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// This file is the triage of poisoned rows, shared by spillway poisoned and
// the operator's OutboxReplay: the selector that picks rows, and the replay
// and park that change them. table_poisoned.go renders the statements.

// PoisonedAction is what a change does to the rows it picks.
type PoisonedAction string

const (
	// ActionReplay resets a row's attempts, last error, lease and due time,
	// so the fleet publishes it again. It also unparks a parked row.
	ActionReplay PoisonedAction = "replay"
	// ActionPark takes a row out of the poisoned count without deleting it:
	// parked_at is set and the row is due at 'infinity', kept for a later
	// replay or an export.
	ActionPark PoisonedAction = "park"
)

// PoisonedSelector picks poisoned rows, or with Parked the parked ones.
// Every criterion set must hold; none set picks every poisoned row, up to
// the limit.
type PoisonedSelector struct {
	// IDs are row ids, as text.
	IDs []string
	// LastErrorPattern is an SQL LIKE pattern on last_error: % is any text,
	// _ any one character, \ escapes the next. Case-sensitive.
	LastErrorPattern string
	// EnqueuedSince and EnqueuedBefore bound enqueued_at: since is
	// inclusive, before exclusive.
	EnqueuedSince, EnqueuedBefore *time.Time
	// Parked picks parked rows instead of poisoned ones, to replay them.
	Parked bool
	// Limit is how many rows are picked at most.
	Limit int
}

// Selector bounds.
const (
	DefaultSelectorLimit = 1000
	MaxSelectorLimit     = 1_000_000
	MaxSelectorIDs       = 1000
	maxIDLength          = 255 // AMQP's limit on message_id, which is the id
	maxPatternLength     = 1024
	// MaxRecordedIDs is how many ids of the rows it changed a change keeps,
	// for its record.
	MaxRecordedIDs = 100
	// DefaultChangeBatch bounds each statement of a change, as retention's
	// batches are bounded, so no lock is held for long.
	DefaultChangeBatch = 1000
)

// Validate checks the selector on its own; CheckSelector checks it against
// a table. Each error names the field, the value and the rule.
func (s PoisonedSelector) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if s.Limit <= 0 || s.Limit > MaxSelectorLimit {
		errs = append(errs, field.Invalid(path.Child("limit"), s.Limit, fmt.Sprintf("must be from 1 to %d", MaxSelectorLimit)))
	}
	if len(s.IDs) > MaxSelectorIDs {
		errs = append(errs, field.TooMany(path.Child("ids"), len(s.IDs), MaxSelectorIDs))
	}
	for i, id := range s.IDs {
		switch {
		case len(id) > maxIDLength:
			errs = append(errs, field.TooLong(path.Child("ids").Index(i), id, maxIDLength))
		case id == "":
			errs = append(errs, field.Invalid(path.Child("ids").Index(i), id, fmt.Sprintf("must be 1 to %d bytes", maxIDLength)))
		case !isText(id):
			errs = append(errs, field.Invalid(path.Child("ids").Index(i), id, textRule))
		}
	}
	if p := s.LastErrorPattern; len(p) > maxPatternLength {
		errs = append(errs, field.TooLong(path.Child("lastErrorPattern"), p, maxPatternLength))
	} else if !isText(p) {
		errs = append(errs, field.Invalid(path.Child("lastErrorPattern"), p, textRule))
	} else if unfinishedEscape(p) {
		errs = append(errs, field.Invalid(path.Child("lastErrorPattern"), p,
			`must not end in an unfinished escape: \ escapes the character after it (write \\ for a backslash)`))
	}
	if s.EnqueuedSince != nil && s.EnqueuedBefore != nil && !s.EnqueuedSince.Before(*s.EnqueuedBefore) {
		errs = append(errs, field.Invalid(path.Child("enqueuedBefore"), s.EnqueuedBefore.Format(time.RFC3339Nano),
			"must be later than enqueuedSince "+s.EnqueuedSince.Format(time.RFC3339Nano)))
	}
	return errs
}

// textRule is what Postgres's text accepts: no zero byte, valid UTF-8.
const textRule = "must be valid UTF-8 without a NUL character, as Postgres text is"

func isText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// unfinishedEscape reports a LIKE pattern whose last backslash escapes
// nothing, which Postgres refuses.
func unfinishedEscape(p string) bool {
	for i := 0; i < len(p); i++ {
		if p[i] == '\\' {
			if i+1 == len(p) {
				return true
			}
			i++
		}
	}
	return false
}

var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// CheckSelector checks that the table can answer the selector for action
// ("" to list): a criterion on a column the table lacks is refused, not
// ignored, since ignoring it would pick more rows than asked. path is the
// selector's; table columns are named under database.columns.
func (t *Table) CheckSelector(action PoisonedAction, s PoisonedSelector, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	columns := field.NewPath("database", "columns")
	if t.cols.AvailableAt == "" {
		errs = append(errs, field.NotFound(columns.Child("availableAt"),
			fmt.Sprintf("available_at in %s: every row's due time, which a replay resets; run spillway migrate, which adds it", t.name)))
	}
	for i, id := range s.IDs {
		if rule := t.idRule(id); rule != "" {
			errs = append(errs, field.Invalid(path.Child("ids").Index(i), id, rule))
		}
	}
	if s.LastErrorPattern != "" && t.cols.LastError == "" {
		errs = append(errs, field.Invalid(path.Child("lastErrorPattern"), s.LastErrorPattern,
			fmt.Sprintf("%s has no lastError column to match (map one with columns.lastError)", t.name)))
	}
	if t.cols.EnqueuedAt == "" {
		for _, bound := range []struct {
			name string
			at   *time.Time
		}{{"enqueuedSince", s.EnqueuedSince}, {"enqueuedBefore", s.EnqueuedBefore}} {
			if bound.at != nil {
				errs = append(errs, field.Invalid(path.Child(bound.name), bound.at.Format(time.RFC3339Nano),
					fmt.Sprintf("%s has no enqueuedAt column to compare with (map one with columns.enqueuedAt)", t.name)))
			}
		}
	}
	if (s.Parked || action == ActionPark) && t.cols.ParkedAt == "" {
		errs = append(errs, field.NotFound(columns.Child("parkedAt"),
			fmt.Sprintf("parked_at in %s: where a parked row is marked; run spillway migrate, which adds it", t.name)))
	}
	return errs
}

// idRule says why id cannot be one of the table's ids, or "".
func (t *Table) idRule(id string) string {
	switch t.idType {
	case "uuid":
		if !uuidPattern.MatchString(id) {
			return "must be a UUID, as the id column is uuid"
		}
	case "bigint", "integer":
		bits := 64
		if t.idType == "integer" {
			bits = 32
		}
		if _, err := strconv.ParseInt(id, 10, bits); err != nil {
			return "must be a whole number in range, as the id column is " + t.idType
		}
	}
	return ""
}

// PoisonedRow is one row of a listing.
type PoisonedRow struct {
	ID       string
	Attempts int
	// EnqueuedAt and ParkedAt are nil when the table lacks the column, and
	// ParkedAt also when the row is not parked.
	EnqueuedAt, ParkedAt *time.Time
	// LastError is cut at maxCauseChars characters and not scrubbed: pass
	// it through ScrubError before showing it.
	LastError string
}

// ListPoisoned lists the rows r's selector picks, oldest first.
func ListPoisoned(ctx context.Context, db Querier, t *Table, r PoisonedRequest) ([]PoisonedRow, error) {
	stmt := t.SelectPoisoned(r)
	rows, err := db.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return nil, fmt.Errorf("list poisoned rows of %s: %w", t.name, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PoisonedRow, error) {
		var row PoisonedRow
		var lastError *string
		err := r.Scan(&row.ID, &row.Attempts, &row.EnqueuedAt, &lastError, &row.ParkedAt)
		if lastError != nil {
			row.LastError = *lastError
		}
		return row, err
	})
	if err != nil {
		return nil, fmt.Errorf("list poisoned rows of %s: %w", t.name, err)
	}
	return out, nil
}

// PoisonedRequest is one replay or park.
type PoisonedRequest struct {
	Action   PoisonedAction
	Selector PoisonedSelector
	// MaxAttempts is the fleet's poison threshold.
	MaxAttempts int
	// Lease is the fleet's leaseTTL: a row claimed less than a lease ago is
	// being published, and no selector picks it.
	Lease time.Duration
	// DryRun counts and lists the rows that would change, and changes none.
	DryRun bool
	// BatchSize bounds each statement (0: 1,000).
	BatchSize int
	// StatementTimeout bounds each statement, and its lock waits, on the
	// server (0: none), as the operator's reads are bounded.
	StatementTimeout time.Duration
}

// Validate checks the request on its own, the selector included.
func (r PoisonedRequest) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if r.Action != ActionReplay && r.Action != ActionPark {
		errs = append(errs, field.NotSupported(path.Child("action"), r.Action, []PoisonedAction{ActionReplay, ActionPark}))
	}
	if r.MaxAttempts <= 0 {
		errs = append(errs, field.Invalid(path.Child("maxAttempts"), r.MaxAttempts, "must be greater than 0"))
	}
	if r.Lease <= 0 {
		errs = append(errs, field.Invalid(path.Child("leaseTTL"), r.Lease.String(), "must be greater than 0: the fleet's leaseTTL"))
	}
	if r.Action == ActionPark && r.Selector.Parked {
		errs = append(errs, field.Invalid(path.Child("selector", "parked"), true, "park picks poisoned rows; parked rows are parked already"))
	}
	return append(errs, r.Selector.Validate(path.Child("selector"))...)
}

// PoisonedChange is what a replay or park did.
type PoisonedChange struct {
	// Matched is how many rows the selector picked when the change began,
	// at most its limit; Counted says the count ran.
	Matched int64
	Counted bool
	// Changed is how many rows were replayed or parked: none in a dry run.
	// Fewer than matched when rows were locked, leased or changed by others
	// meanwhile.
	Changed int64
	// IDs are the first MaxRecordedIDs rows changed, or in a dry run
	// matched.
	IDs []string
}

// TxStarter is what a change runs on: a pool or one connection.
type TxStarter interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ChangePoisoned counts the rows the request picks, then, unless it is a dry
// run, replays or parks them in bounded batches, each one statement in a
// short transaction of its own, until the limit is reached or no more rows
// can be taken. On an error it returns what it did so far with the error, so
// a caller can record the progress and carry on later: a row already
// changed is no longer picked.
//
// path names the request in errors: spec for an OutboxReplay, nil on the
// command line.
func ChangePoisoned(ctx context.Context, db TxStarter, t *Table, r PoisonedRequest, path *field.Path) (PoisonedChange, error) {
	errs := r.Validate(path)
	errs = append(errs, t.CheckSelector(r.Action, r.Selector, path.Child("selector"))...)
	if len(errs) > 0 {
		return PoisonedChange{}, &InvalidSelectorError{Errs: errs}
	}
	var done PoisonedChange
	count := t.CountPoisoned(r)
	err := inTx(ctx, db, r.StatementTimeout, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, count.SQL, count.Args...).Scan(&done.Matched)
	})
	if err != nil {
		return done, fmt.Errorf("count poisoned rows of %s: %w", t.name, err)
	}
	done.Counted = true
	if r.DryRun {
		sample := r
		sample.Selector.Limit = min(sample.Selector.Limit, MaxRecordedIDs)
		err := inTx(ctx, db, r.StatementTimeout, func(tx pgx.Tx) error {
			rows, err := ListPoisoned(ctx, tx, t, sample)
			for _, row := range rows {
				done.IDs = append(done.IDs, row.ID)
			}
			return err
		})
		return done, err
	}
	batch := r.BatchSize
	if batch <= 0 {
		batch = DefaultChangeBatch
	}
	for done.Changed < int64(r.Selector.Limit) {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		size := min(batch, r.Selector.Limit-int(done.Changed))
		stmt := t.ParkPoisoned(r, size)
		if r.Action == ActionReplay {
			stmt = t.ReplayPoisoned(r, size)
		}
		var ids []string
		err := inTx(ctx, db, r.StatementTimeout, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, stmt.SQL, stmt.Args...)
			if err != nil {
				return err
			}
			ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		})
		if err != nil {
			return done, fmt.Errorf("%s poisoned rows of %s: %w", r.Action, t.name, err)
		}
		done.Changed += int64(len(ids))
		done.IDs = append(done.IDs, ids[:min(len(ids), MaxRecordedIDs-len(done.IDs))]...)
		// Short: the rest are locked, leased, or gone; SKIP LOCKED would
		// skip them again at once.
		if len(ids) < size {
			break
		}
	}
	return done, nil
}

// InvalidSelectorError is a request that cannot be carried out as it is:
// trying again will not change it.
type InvalidSelectorError struct{ Errs field.ErrorList }

func (e *InvalidSelectorError) Error() string { return e.Errs.ToAggregate().Error() }

// inTx runs fn in a transaction of its own, whose statements and lock
// waits the server stops at timeout, when one is given.
func inTx(ctx context.Context, db TxStarter, timeout time.Duration, fn func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if timeout > 0 {
		limits := ProbeLimits(timeout)
		if _, err := tx.Exec(ctx, limits.SQL, limits.Args...); err != nil {
			return err
		}
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
