package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The sessions a drainer holds on its own, beside its pool: the LISTEN on
// the table's notify channel, the notify hush, the --max-rate roster and the
// broker-blocked flag, whose locks are let go when their session ends; and
// their statements. Through a pooler in transaction mode there are such
// sessions only on a direct URL; without one, each does without (see
// ErrNoSessions).

// ErrNoSessions is a session of a drainer's own asked of a store that has
// none: a pooler in transaction mode, and no direct URL past it.
var ErrNoSessions = errors.New("no session of its own: the database is reached through a pooler in transaction mode, and no direct URL is given")

// HasSessions reports whether the store can hold sessions of its own.
func (s *Store) HasSessions() bool { return s.sessions != nil }

// Listen holds a connection of its own in LISTEN on the table's notify
// channel. It calls listening once the LISTEN is in place and notified on
// every notification, and returns when the connection fails or ctx ends.
func (s *Store) Listen(ctx context.Context, spec TableSpec, listening, notified func()) error {
	if s.sessions == nil {
		return ErrNoSessions
	}
	pc, err := s.sessions.Acquire(ctx)
	if err != nil {
		return err
	}
	// Hijacked, the connection leaves the pool for good: a LISTEN session
	// must not be handed to a claim.
	conn := pc.Hijack()
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(ctx)
	}()
	if _, err := conn.Exec(ctx, spec.Listen().SQL); err != nil {
		return fmt.Errorf("listen on %s: %w", spec.NotifyChannel(), err)
	}
	listening()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		notified()
	}
}

// NotifyHush is a session of its own on which a drainer that claims on its
// own holds the notify trigger's lock in shared mode, so that commits into
// the table skip notifying. The session ending lets go of the lock, so a
// drainer that dies leaves no hush behind. Claim loop only.
type NotifyHush struct {
	pool *pgxpool.Pool
	spec TableSpec
	conn *pgx.Conn
	held bool
	// quietUntil: after a failure, no try before then, so that a database
	// refusing sessions is not asked for one at every claim.
	quietUntil time.Time
}

// NotifyHush returns the hush of spec's notifications, not yet held.
// Without sessions it is never held, and commits keep notifying.
func (s *Store) NotifyHush(spec TableSpec) *NotifyHush {
	return &NotifyHush{pool: s.sessions, spec: spec}
}

const (
	// hushTimeout bounds a hush statement: the lock is only tried, never
	// waited for.
	hushTimeout = time.Second
	// hushRetry is how long a failed hush waits before the next try;
	// meanwhile commits notify, as without it.
	hushRetry = time.Minute
)

// Held reports whether commits are hushed by this drainer.
func (h *NotifyHush) Held() bool { return h.held }

// Hush tries the lock; a transaction notifying at that moment holds it, and
// then commits keep notifying until the next try.
func (h *NotifyHush) Hush(ctx context.Context) error {
	if h.pool == nil || h.held || time.Now().Before(h.quietUntil) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, hushTimeout)
	defer cancel()
	if h.conn == nil {
		conn, err := ownSession(ctx, h.pool)
		if err != nil {
			h.quietUntil = time.Now().Add(hushRetry)
			return fmt.Errorf("hush notifications on %s: %w", h.spec.NotifyChannel(), err)
		}
		h.conn = conn
	}
	stmt := h.spec.NotifyHush()
	if err := h.conn.QueryRow(ctx, stmt.SQL, stmt.Args...).Scan(&h.held); err != nil {
		h.Close()
		h.quietUntil = time.Now().Add(hushRetry)
		return fmt.Errorf("hush notifications on %s: %w", h.spec.NotifyChannel(), err)
	}
	return nil
}

// Unhush lets go of the lock; if that fails, closing the session does.
func (h *NotifyHush) Unhush(ctx context.Context) error {
	if !h.held {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, hushTimeout)
	defer cancel()
	stmt := h.spec.NotifyUnhush()
	if _, err := h.conn.Exec(ctx, stmt.SQL, stmt.Args...); err != nil {
		h.Close()
		return fmt.Errorf("unhush notifications on %s: %w", h.spec.NotifyChannel(), err)
	}
	h.held = false
	return nil
}

// Close ends the session, and with it the hush.
func (h *NotifyHush) Close() {
	closeSession(h.conn)
	h.conn, h.held = nil, false
}

// ownSession takes a connection out of the pool for a session-level lock,
// which must not go with it to a claim.
func ownSession(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, error) {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return pc.Hijack(), nil
}

// closeSession ends a session of ownSession's, and with it its locks.
func closeSession(conn *pgx.Conn) {
	if conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), sessionCloseTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}

// sessionCloseTimeout bounds the goodbye to a session: a database that does
// not answer must not hold up a drainer's shutdown.
const sessionCloseTimeout = time.Second

// Roster is a session of its own on which a capped drainer holds the
// table's roster lock in shared mode, and counts the other holders to take
// its share of --max-rate. The session ending lets go of the lock, so a
// drainer that dies or stops is out of the count at once. Used by one
// claim at a time.
type Roster struct {
	pool *pgxpool.Pool
	spec TableSpec
	conn *pgx.Conn
}

// Roster returns spec's roster, not yet joined. Without sessions, Others
// fails with ErrNoSessions.
func (s *Store) Roster(spec TableSpec) *Roster { return &Roster{pool: s.sessions, spec: spec} }

// rosterTimeout bounds joining and counting; the count is only tried again a
// second later.
const rosterTimeout = time.Second

// Others joins the roster if this drainer has not, or has lost its session,
// and counts the other drainers in it.
func (r *Roster) Others(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, rosterTimeout)
	defer cancel()
	if r.pool == nil {
		return 0, ErrNoSessions
	}
	if r.conn == nil {
		conn, err := ownSession(ctx, r.pool)
		if err != nil {
			return 0, fmt.Errorf("join the drainers of %s: %w", r.spec.Name, err)
		}
		r.conn = conn
		join := r.spec.RosterJoin()
		var joined bool
		err = r.conn.QueryRow(ctx, join.SQL, join.Args...).Scan(&joined)
		if err == nil && !joined {
			err = errors.New("a session other than a drainer's holds its roster lock exclusively")
		}
		if err != nil {
			r.Close()
			return 0, fmt.Errorf("join the drainers of %s: %w", r.spec.Name, err)
		}
	}
	stmt := r.spec.RosterOthers()
	var n int
	if err := r.conn.QueryRow(ctx, stmt.SQL, stmt.Args...).Scan(&n); err != nil {
		r.Close()
		return 0, fmt.Errorf("count the drainers of %s: %w", r.spec.Name, err)
	}
	return n, nil
}

// Close ends the session, and with it this drainer's place in the roster.
func (r *Roster) Close() {
	closeSession(r.conn)
	r.conn = nil
}

// BlockedFlag is a session of its own on which a drainer holds the table's
// broker-blocked lock, in shared mode, while its broker blocks publishing:
// the operator's read counts the holders, and the fleet's Ready condition
// names the block. The session ending lets go of the lock, so a drainer
// that dies is out of the count at once. Held only while blocked, it costs
// a connection only then. Used by the claim loop alone.
type BlockedFlag struct {
	pool *pgxpool.Pool
	spec TableSpec
	conn *pgx.Conn
}

// BlockedFlag returns spec's flag, lowered. Without sessions it is never
// raised: the drainer's readiness alone says that the broker blocks.
func (s *Store) BlockedFlag(spec TableSpec) *BlockedFlag {
	return &BlockedFlag{pool: s.sessions, spec: spec}
}

// Raise takes the lock, unless this drainer holds it already.
func (f *BlockedFlag) Raise(ctx context.Context) error {
	if f.pool == nil || f.conn != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, rosterTimeout)
	defer cancel()
	conn, err := ownSession(ctx, f.pool)
	if err != nil {
		return fmt.Errorf("flag the broker's block on %s: %w", f.spec.Name, err)
	}
	stmt := f.spec.BlockedFlagRaise()
	var raised bool
	if err := conn.QueryRow(ctx, stmt.SQL, stmt.Args...).Scan(&raised); err != nil || !raised {
		closeSession(conn)
		if err == nil {
			err = errors.New("a session other than a drainer's holds the lock exclusively")
		}
		return fmt.Errorf("flag the broker's block on %s: %w", f.spec.Name, err)
	}
	f.conn = conn
	return nil
}

// Lower ends the session, and with it the flag.
func (f *BlockedFlag) Lower() {
	closeSession(f.conn)
	f.conn = nil
}

// NotifyHush renders the try of the notify trigger's lock in shared mode,
// for a session of its own. While a drainer holds it, claiming every
// --wake-coalesce because rows keep coming, commits skip notifying: at a
// steady 1,000 commits/s the notifications alone cost Postgres half again
// the CPU of the inserts, and a drainer that is claiming anyway needs none.
func (s TableSpec) NotifyHush() Statement {
	return Statement{SQL: "SELECT pg_try_advisory_lock_shared(" + notifyLock("$1") + ")", Args: []any{s.NotifyChannel()}}
}

// NotifyUnhush renders the release of NotifyHush's lock.
func (s TableSpec) NotifyUnhush() Statement {
	return Statement{SQL: "SELECT pg_advisory_unlock_shared(" + notifyLock("$1") + ")", Args: []any{s.NotifyChannel()}}
}

// Two advisory locks of a table, named by $1, are held in shared mode by
// drainers on sessions of their own, and their holders counted:
//   - rosterLock, by every capped drainer (Roster): its holders are the
//     drainers running, whatever they hold or wait for;
//   - blockedLock, by every drainer whose broker blocks publishing
//     (BlockedFlag), counted by the operator's read.
//
// Advisory locks are the database's, so the same table name in another
// database is another roster.
const (
	rosterLock  = "hashtext('spillway.roster'), hashtext($1)"
	blockedLock = "hashtext('spillway.broker_blocked'), hashtext($1)"
)

// lockTable is the table locks' $1.
func (s TableSpec) lockTable() string {
	schema, name := s.QualifiedName()
	return schema + "." + name
}

// RosterJoin renders the take of the roster lock, in shared mode so that it
// never waits on another drainer's.
func (s TableSpec) RosterJoin() Statement {
	return Statement{SQL: "SELECT pg_try_advisory_lock_shared(" + rosterLock + ")", Args: []any{s.lockTable()}}
}

// RosterOthers renders the count of the other sessions holding the roster
// lock, run on the session holding it.
func (s TableSpec) RosterOthers() Statement {
	return Statement{SQL: lockHolders(rosterLock) + " AND pid <> pg_backend_pid()", Args: []any{s.lockTable()}}
}

// BlockedFlagRaise renders the take of the broker-blocked lock.
func (s TableSpec) BlockedFlagRaise() Statement {
	return Statement{SQL: "SELECT pg_try_advisory_lock_shared(" + blockedLock + ")", Args: []any{s.lockTable()}}
}

// BlockedDrainers renders the count of the drainers holding the
// broker-blocked lock.
func (s TableSpec) BlockedDrainers() Statement {
	return Statement{SQL: lockHolders(blockedLock), Args: []any{s.lockTable()}}
}

// lockHolders is the count of the sessions holding the advisory lock key.
// pg_locks shows a key of two int4 as classid and objid, with objsubid 2.
func lockHolders(key string) string {
	return `SELECT count(*) FROM pg_locks, (SELECT ` + key + `) AS k(k1, k2)
WHERE locktype = 'advisory' AND granted
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND classid = k1::oid AND objid = k2::oid AND objsubid = 2`
}

// Listen renders the LISTEN on the table's notify channel.
func (s TableSpec) Listen() Statement { return Statement{SQL: "LISTEN " + q(s.NotifyChannel())} }
