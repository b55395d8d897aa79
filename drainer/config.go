package drainer

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/spillway-io/spillway/drainer/rabbitmq"
	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/drainer/webhook"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// worstCasePublish is the publish time the lease rule assumes for every
// message of a full pipeline.
const worstCasePublish = 100 * time.Millisecond

// Config is one drainer's configuration. Durations are Go durations.
type Config struct {
	DrainerID string
	Database  secret.URLSource
	// Pooling is how the database URL's server pools sessions.
	Pooling outbox.Pooling
	Table   outbox.TableSpec
	Broker  rabbitmq.Config
	// Webhook, when set, is where rows go instead of the broker.
	Webhook *webhook.Config
	// Format is how each message presents its row: plain, or as a
	// CloudEvent, whose source defaults to /spillway/ and the table's name.
	Format sink.Format
	// Tracing, when set, is where the drainer's spans go (see tracing.go);
	// a row's trace context is carried on in its message either way.
	Tracing trace.TracerProvider

	BatchSize     int
	PipelineDepth int
	LeaseTTL      time.Duration
	PollInterval  time.Duration
	// ConfirmTimeout bounds each confirm wait; zero means a third of the lease.
	ConfirmTimeout time.Duration
	MaxAttempts    int
	RetryInitial   time.Duration
	RetryMax       time.Duration
	// MaxPayloadBytes: a larger row is never loaded, and fails with a reason.
	MaxPayloadBytes int64
	// MaxClaimBytes is each claim's payload budget: a claim stops at the
	// first row that would take it over, and a larger row is claimed alone.
	// With the claim ahead and the batch being published, it bounds the
	// payload bytes in memory to about twice the budget.
	MaxClaimBytes int64
	// MaxPipelineBytes bounds the payload bytes published and awaiting
	// their confirm; a larger message is published alone.
	MaxPipelineBytes int64
	// SynchronousCommit off keeps the application's commits from queueing
	// behind the drainer's WAL flushes; a claim or mark lost in a database
	// crash only causes a duplicate, never a loss.
	SynchronousCommit bool
	// ShutdownTimeout bounds the graceful stop: waiting for the confirms in
	// flight, settling them and releasing the rest.
	ShutdownTimeout time.Duration
	Retention       Retention
	// WakeCoalesce is the least time between the starts of claims woken by
	// notifications: the commits of a steady stream share a claim, and a
	// lone commit after a quiet spell is claimed at once.
	WakeCoalesce time.Duration
	// MaxRate caps the events per second that all the drainers of the table
	// publish together (0: no cap); each takes an equal share of it.
	MaxRate float64
	// MaxRateDrainers is how many drainers share MaxRate when they cannot
	// count each other: a pooler in transaction mode, and no direct URL to
	// hold the roster's lock on.
	MaxRateDrainers int
	// MaxCommitLatency paces the drain by the database's commits (0: off):
	// while a commit takes longer, the drainer slows down (commitGuard).
	MaxCommitLatency time.Duration
	// SerialBatches waits for a batch to settle before claiming the next. It
	// exists to measure what overlapping claims with confirms buys; there is
	// no flag for it.
	SerialBatches bool
	// LeaseInDueTime claims as Spillway did before its claims became
	// heap-only (see outbox.ClaimParams). It exists for make bench's
	// side-by-side of the two designs; there is no flag for it.
	LeaseInDueTime bool
}

// Retention prunes old rows. A nil UnpublishedMaxAge keeps pending rows
// forever.
type Retention struct {
	// Published keeps published rows, marked with published_at, and deletes
	// them once it is this old. Nil or zero keeps none: the settle deletes a
	// row once its publish is confirmed, which costs the database a fifth
	// less CPU and half the WAL of marking it (make bench).
	Published *time.Duration
	// UnpublishedMaxAge deletes pending rows (poisoned ones included) once
	// enqueued_at is this old: events given up on, counted in the log.
	UnpublishedMaxAge *time.Duration
	// Interval is the pause between prune runs.
	Interval time.Duration
	// BatchSize bounds each DELETE, so no lock is held for long.
	BatchSize int
}

// enabled reports whether any window is set.
func (r Retention) enabled() bool { return r.Published != nil || r.UnpublishedMaxAge != nil }

// deletesPublished reports whether the settle deletes published rows rather
// than marking them. Only a zero window also prunes the rows kept before it:
// unset, rows an earlier setting kept are left as they are, so an upgrade
// deletes no history.
func (r Retention) deletesPublished() bool { return r.Published == nil || *r.Published == 0 }

// DefaultConfig returns the defaults a user gets without flags.
func DefaultConfig() Config {
	return Config{
		Table:  outbox.TableSpec{Name: outbox.DefaultTableName},
		Broker: rabbitmq.DefaultConfig(),
		// Measured in make bench: batches of 500 halve the statements per
		// event against 100 and cost Postgres a fifth less per event; 256
		// confirms in flight drain as fast as the best tuned run, where 100
		// reached 0.83 of it and 200 0.91. The lease rule then asks for
		// 76.8 s of lease.
		BatchSize:     500,
		PipelineDepth: 256,
		LeaseTTL:      80 * time.Second,
		PollInterval:  time.Second,
		// At 1,000 commits/s in make bench, 8 ms kept commit → published
		// p50 at 8.3–8.6 ms and Postgres within 1.1–1.3 × polling; 10 ms
		// put p50 at 8.7–10.2 ms, on the 10 ms target.
		WakeCoalesce:    8 * time.Millisecond,
		MaxAttempts:     10,
		RetryInitial:    time.Second,
		RetryMax:        10 * time.Minute,
		MaxPayloadBytes: 16 << 20,
		// Two claims of 8 MiB, or of one 16 MiB row, fit a 256 MiB pod
		// with room for the Go heap's growth and the connections' buffers.
		MaxClaimBytes:    8 << 20,
		MaxPipelineBytes: 16 << 20,
		ShutdownTimeout:  30 * time.Second,
		Retention:        Retention{Interval: time.Minute, BatchSize: 1000},
		MaxRateDrainers:  1,
	}
}

// validateSink checks the settings of the sink the drainer publishes to: the
// webhook's, when set, or the broker's. A request must time out well within
// the lease, as a confirm must.
func (c Config) validateSink() field.ErrorList {
	if c.Webhook == nil {
		return c.Broker.Validate(field.NewPath("broker"))
	}
	path := field.NewPath("sink", "webhook")
	errs := c.Webhook.Validate(path)
	if c.Webhook.Timeout > c.LeaseTTL/3 {
		errs = append(errs, field.Invalid(path.Child("timeout"), c.Webhook.Timeout.String(),
			"must be at most a third of leaseTTL "+c.LeaseTTL.String()+", so a request ends well within its rows' lease"))
	}
	return errs
}

// sinkName is what the log and the readiness probe call the sink.
func (c Config) sinkName() string {
	if c.Webhook != nil {
		return "webhook"
	}
	return "broker"
}

// sinkUnavailable is the log line of a sink that cannot be dialled.
func (c Config) sinkUnavailable() string {
	name := c.sinkName()
	return strings.ToUpper(name[:1]) + name[1:] + " unavailable; claiming paused"
}

// MinLeaseTTL is the shortest lease that covers a full pipeline of
// worst-case publishes three times over.
func MinLeaseTTL(pipelineDepth int) time.Duration {
	return 3 * time.Duration(pipelineDepth) * worstCasePublish
}

// confirmTimeout is the deadline of one confirm wait; always under the lease,
// so a row whose confirm never comes is released before another drainer may
// take it over.
func (c Config) confirmTimeout() time.Duration {
	if c.ConfirmTimeout > 0 {
		return c.ConfirmTimeout
	}
	return c.LeaseTTL / 3
}

// ClaimParams are the parameters of this config's claims.
func (c Config) ClaimParams() outbox.ClaimParams {
	return outbox.ClaimParams{
		DrainerID:       c.DrainerID,
		BatchSize:       c.BatchSize,
		MaxAttempts:     c.MaxAttempts,
		LeaseMillis:     c.LeaseTTL.Milliseconds(),
		MaxPayloadBytes: c.MaxPayloadBytes,
		MaxClaimBytes:   c.MaxClaimBytes,
		LeaseInDueTime:  c.LeaseInDueTime,
	}
}

// failurePolicy is what a failed attempt costs a row under this config.
// When ordering skips failures, the first failure poisons the row: a retry
// after the later rows of its key went on would publish it out of order.
func (c Config) failurePolicy() outbox.FailurePolicy {
	f := outbox.FailurePolicy{InitialMillis: c.RetryInitial.Milliseconds(), MaxMillis: c.RetryMax.Milliseconds(), MaxAttempts: c.MaxAttempts}
	if c.Table.Ordering.Skips() {
		f.MaxAttempts = 1
	}
	return f
}

// Validate checks every rule; each error names the field, the value and the rule.
func (c Config) Validate() error {
	var errs field.ErrorList
	if c.DrainerID == "" {
		errs = append(errs, field.Required(field.NewPath("drainerID"), "set --drainer-id or POD_NAME"))
	}
	errs = append(errs, c.Database.Validate(field.NewPath("database"), "the outbox database's connection URL")...)
	errs = append(errs, c.Pooling.Validate(field.NewPath("database"))...)
	errs = append(errs, c.validateSink()...)
	if c.Format.Mode != "" && !slices.Contains(sink.FormatModes, c.Format.Mode) {
		errs = append(errs, field.NotSupported(field.NewPath("messageFormat"), c.Format.Mode, sink.FormatModes))
	}
	errs = append(errs, c.Table.Validate(field.NewPath("database"))...)
	if c.BatchSize <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("batchSize"), c.BatchSize, "must be greater than 0"))
	}
	if c.PipelineDepth <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("pipelineDepth"), c.PipelineDepth, "must be greater than 0"))
	} else if minLease := MinLeaseTTL(c.PipelineDepth); c.LeaseTTL < minLease {
		errs = append(errs, field.Invalid(field.NewPath("leaseTTL"), c.LeaseTTL.String(),
			fmt.Sprintf("must be at least 3 × pipelineDepth × %s = %s for pipelineDepth %d", worstCasePublish, minLease, c.PipelineDepth)))
	}
	if c.PollInterval <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("pollInterval"), c.PollInterval.String(), "must be greater than 0"))
	}
	if c.ConfirmTimeout < 0 || (c.ConfirmTimeout > 0 && c.ConfirmTimeout >= c.LeaseTTL) {
		errs = append(errs, field.Invalid(field.NewPath("confirmTimeout"), c.ConfirmTimeout.String(), "must be 0 (a third of leaseTTL) or positive and shorter than leaseTTL "+c.LeaseTTL.String()))
	}
	if c.MaxAttempts <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("maxAttempts"), c.MaxAttempts, "must be greater than 0"))
	}
	if c.RetryInitial <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("retryBackoff", "initial"), c.RetryInitial.String(), "must be greater than 0"))
	}
	if c.RetryMax < c.RetryInitial {
		errs = append(errs, field.Invalid(field.NewPath("retryBackoff", "max"), c.RetryMax.String(), "must be at least retryBackoff.initial "+c.RetryInitial.String()))
	}
	if c.MaxPayloadBytes <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("maxPayloadBytes"), c.MaxPayloadBytes, "must be greater than 0"))
	}
	if c.MaxClaimBytes <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("maxClaimBytes"), c.MaxClaimBytes, "must be greater than 0"))
	}
	if c.MaxPipelineBytes <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("maxPipelineBytes"), c.MaxPipelineBytes, "must be greater than 0"))
	}
	if c.WakeCoalesce < 0 || c.WakeCoalesce >= c.PollInterval {
		errs = append(errs, field.Invalid(field.NewPath("wakeCoalesce"), c.WakeCoalesce.String(), "must be 0 (claim at once) or positive and shorter than pollInterval "+c.PollInterval.String()))
	}
	if c.MaxRate < 0 || math.IsNaN(c.MaxRate) || math.IsInf(c.MaxRate, 0) {
		errs = append(errs, field.Invalid(field.NewPath("maxRate"), c.MaxRate, "must be 0 (no cap) or a positive number of events per second"))
	}
	if c.MaxRateDrainers <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("maxRateDrainers"), c.MaxRateDrainers, "must be greater than 0"))
	}
	if c.MaxCommitLatency < 0 {
		errs = append(errs, field.Invalid(field.NewPath("maxCommitLatency"), c.MaxCommitLatency.String(), "must be 0 (off) or a positive duration"))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("shutdownTimeout"), c.ShutdownTimeout.String(), "must be greater than 0"))
	}
	errs = append(errs, c.Retention.validate(field.NewPath("retention"))...)
	return errs.ToAggregate()
}

// validate refuses a negative window, and a zero unpublishedMaxAge, which
// would delete the whole pending set. A zero published window keeps no
// published row, and prunes those an earlier window kept.
func (r Retention) validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if r.Published != nil && *r.Published < 0 {
		errs = append(errs, field.Invalid(path.Child("published"), r.Published.String(),
			"must be 0 (delete each row once published) or more (keep published rows this long)"))
	}
	if r.UnpublishedMaxAge != nil && *r.UnpublishedMaxAge <= 0 {
		errs = append(errs, field.Invalid(path.Child("unpublishedMaxAge"), r.UnpublishedMaxAge.String(),
			"must be greater than 0 (leave it unset to keep unpublished rows forever)"))
	}
	if r.enabled() && r.Interval <= 0 {
		errs = append(errs, field.Invalid(path.Child("interval"), r.Interval.String(), "must be greater than 0"))
	}
	if r.enabled() && r.BatchSize <= 0 {
		errs = append(errs, field.Invalid(path.Child("batchSize"), r.BatchSize, "must be greater than 0"))
	}
	return errs
}
