// Package outbox is Spillway's table layer: the one package that speaks to
// Postgres. It holds the outbox table's mapping (TableSpec, Columns,
// resolved against the catalog into a Table), renders every statement the
// drainers and the operator run (Table's methods, in table*.go; a
// session's LISTEN and advisory locks in sessions.go; the status read in
// outbox_status.go), and runs them: a drainer's Store, migrate, the status
// reads, the changes of poisoned rows, and the operator's Reader.
//
// A Table method renders a statement and is named for what it does
// (Claim, MarkPublished, ReplayPoisoned); the Store method of the same name
// runs it and returns what it did (a Claimed, a Settled).
//
// Words of the domain, as the code uses them:
//   - due time: available_at. A fresh row is due when enqueued, a row in
//     backoff when its backoff ends, a claimed row when its lease ends; a
//     poisoned or parked row never ('infinity').
//   - claim, lease, token: a claim takes due rows and stamps claimed_by,
//     claimed_at (the token) and a due time a lease ahead. Every settle is
//     fenced on the token, so a row whose lease expired and was claimed
//     again is left to its new claim.
//   - settle: phase 3, marking published, recording failures, releasing.
//   - live: a due row a claim may take: attempts left and not parked.
//     A spent row is due but not live; shelving gives it 'infinity'.
//   - poisoned: at maxAttempts; parked: set aside by a person, out of the
//     poisoned count, until replayed.
//   - head, waiting: with per-key ordering, the first unpublished row of a
//     key; the rows behind it wait at a due time past any claim's reach.
//   - hush: a shared advisory lock a drainer that claims on its own holds,
//     so that inserting commits skip notifying it.
//   - roster: the drainers of a table under --max-rate, counted by the
//     holders of a shared advisory lock, to share the cap.
//   - rehearsal: the drainers' statements planned under EXPLAIN, run by no
//     one, which tells whether the database would refuse them.
//   - refusal: the database's answer to a statement it will not run for a
//     reason waiting would not cure (a table gone, a privilege revoked).
//     A write a read-only server refuses (25006, a demoted primary) is not
//     one: the cure is the primary, found by dropping the sessions.
//   - pool mode, direct URL: how the URL's server hands out sessions
//     (pooling.go). Through a pooler in transaction mode no state lasts on
//     a session: the settings open each claim and settle, statements go
//     unnamed, and a drainer's own sessions (LISTEN, hush, roster, blocked
//     flag) go past the pooler on the direct URL, or are done without.
package outbox
