// Package drainer is Spillway's engine: the three-phase loop that claims due
// rows from an outbox (through package outbox), publishes each through a
// sink (package sink; RabbitMQ is package rabbitmq) and settles each as the
// sink's outcome says, never holding a transaction open while it publishes.
// Each phase is in the file named for it: claim.go (phase 1, and the loop
// that drives the others), publish.go (phase 2; pipeline.go is its window of
// messages in flight) and settle.go (phase 3); drainer.go holds the Drainer
// itself, its start and its shutdown.
//
// Words of the engine, as the code uses them (the table's own words, such as
// claim, lease, live and poisoned, are in package outbox):
//   - claim loop, settle loop: the two goroutines of a Drainer. The claim
//     loop claims, publishes and collects each message's outcome; the settle
//     loop settles each batch once every row of it has one.
//   - pipeline: the messages published and awaiting their outcome, bounded
//     by --pipeline-depth and --max-pipeline-bytes; a batch is one claim's
//     rows on their way through it.
//   - outcome: what settling does with a row: published, failed (an attempt
//     and last_error), or released (back in line, no attempt counted).
//   - pushback: the claim loop's backoff after the broker nacked publishes,
//     which is the broker saying no, not the rows being bad.
//   - strikes: the broker connection failures a row was in flight through,
//     alone; a row with strikesToFail of them breaks the connection and
//     counts an attempt instead of coming back for ever.
//   - rate cap: --max-rate, shared by the drainers of a table.
//   - commit guard: --max-commit-latency, which paces the drain by how long
//     a commit on the database takes, timed against the bound.
//   - shelving: giving spent rows (no attempts left, or parked) a due time
//     no claim reaches, so that they never stand in front of live rows.
package drainer
