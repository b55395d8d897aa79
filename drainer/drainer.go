package drainer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// outcomeKind is what phase 3 does with a row.
type outcomeKind int

const (
	// published: the broker acked it.
	published outcomeKind = iota
	// failed: the broker returned it, or the row cannot be published; the
	// row is at fault, so an attempt is counted and it backs off.
	failed
	// released: the outcome is unknown, or the broker is unavailable or
	// pushing back. The row did nothing wrong, so no attempt is counted: a
	// duplicate is possible, a loss is not.
	released
)

// Release reasons, used as metric labels.
const (
	releaseConfirmLost       = "confirm_lost"
	releaseConfirmTimeout    = "confirm_timeout"
	releaseBrokerUnavailable = "broker_unavailable"
	releaseBrokerBlocked     = "broker_blocked"
	releaseShutdown          = "shutdown"
	releaseNack              = "nack"
	releaseLeaseEnding       = "lease_ending"
)

type outcome struct {
	kind   outcomeKind
	reason string // metric label, for failed and released
	detail string // last_error, for failed
	// retryAfter and poison are what the far end asked of a failed row's
	// next attempt (see sink.Outcome).
	retryAfter time.Duration
	poison     bool
}

// batch is one claim's rows and, once confirmed, their outcomes. After a row
// is published its payload is dropped: phase 3 needs only its lease.
type batch struct {
	claim    outbox.Claimed
	outcomes []outcome
	// span is the claim's span, which its rows' publish spans link to.
	span trace.SpanContext
	// settled is closed once phase 3 is done with the batch.
	settled chan struct{}
}

// Drainer runs the three-phase loop for one drainer ID.
type Drainer struct {
	cfg     Config
	store   *outbox.Store
	metrics *Metrics
	log     *slog.Logger
	// dialer opens the sink's connections; broker is the open one, owned by
	// the goroutine running the claim loop, and current the same, for the
	// readiness probe.
	dialer  sink.Dialer
	broker  sink.Sink
	current atomic.Pointer[openSink]
	// dialFailure is why the last dial failed, until one succeeds: what
	// /readyz says while the broker is not connected. No secret: the
	// dialer's errors show URLs without their passwords.
	dialFailure atomic.Pointer[string]
	// wake cuts an idle wait short: new rows were notified, or the broker's
	// state changed.
	wake chan struct{}
	// liveness is what /healthz reports.
	liveness liveness
	// pushback, strikes, hush, roster and blockedFlag belong to the claim
	// loop's goroutine.
	pushback pushback
	strikes  strikes
	hush     *outbox.NotifyHush
	roster   *outbox.Roster
	// countOthers counts the other drainers sharing --max-rate: the roster,
	// or, with no session to hold it on, the fleet size given.
	countOthers func(context.Context) (int, error)
	// dropListen ends the LISTEN session, which the next one replaces.
	dropListen atomic.Pointer[context.CancelFunc]
	// blockedFlag tells the operator that the broker blocks publishing.
	blockedFlag *outbox.BlockedFlag
	// held are the claims in phases 2 and 3.
	held heldClaims
	// refusals are the claims and settles the database keeps refusing.
	refusals *refusals
	// rotateBroker asks for a reconnect between batches: the broker URL
	// file changed.
	rotateBroker atomic.Bool
	// rate is --max-rate's share and the commit guard's pace, or nil.
	rate *rateCap
	// guard is --max-commit-latency, or nil; settle goroutine only.
	guard *commitGuard
	// tracer is nil while tracing is off; span is how the sink's publishes
	// appear as spans.
	tracer trace.Tracer
	span   sink.SpanShape
}

// New checks the config and returns a drainer over store.
func New(cfg Config, store *outbox.Store, metrics *Metrics, log *slog.Logger) (*Drainer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Retention.UnpublishedMaxAge != nil && !store.Table().HasEnqueuedAt() {
		return nil, field.Invalid(field.NewPath("retention", "unpublishedMaxAge"), cfg.Retention.UnpublishedMaxAge.String(),
			"needs an enqueuedAt column to age rows by, and "+store.Table().Name()+" has none")
	}
	if cfg.Format.CloudEvents() && cfg.Format.Source == "" {
		cfg.Format.Source = "/spillway/" + store.Table().Name()
	}
	d := &Drainer{
		cfg:         cfg,
		store:       store,
		metrics:     metrics,
		log:         log.With("table", store.Table().Name()),
		dialer:      dialerOf(cfg, store.Table().PayloadType(), metrics, log.With("table", store.Table().Name())),
		wake:        make(chan struct{}, 1),
		liveness:    liveness{lease: cfg.LeaseTTL},
		pushback:    pushback{backoff: newRetryBackoff()},
		strikes:     strikes{},
		hush:        store.NotifyHush(cfg.Table),
		roster:      store.Roster(cfg.Table),
		blockedFlag: store.BlockedFlag(cfg.Table),
		held:        heldClaims{tokens: map[int64]int{}},
		refusals:    newRefusals(store.Table().Name(), metrics),
		guard:       newCommitGuard(cfg.MaxCommitLatency),
	}
	if cfg.Tracing != nil {
		d.tracer, d.span = cfg.Tracing.Tracer(tracerName), d.dialer.Span()
	}
	d.countOthers = d.roster.Others
	if !store.HasSessions() {
		others := cfg.MaxRateDrainers - 1
		d.countOthers = func(context.Context) (int, error) { return others, nil }
	}
	d.rate = newRateCap(cfg.MaxRate, cfg.BatchSize, d.guard.allowed())
	if d.guard != nil {
		d.metrics.CommitPace.Set(d.guard.pace)
	}
	d.liveness.beat(0)
	return d, nil
}

// openSink holds the open sink, for the readiness probe.
type openSink struct{ sink.Sink }

// poke wakes the claim loop if it is idle, or makes its next idle wait short.
func (d *Drainer) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// brokerChanged is the sink's word that the connection failed, or was
// blocked or unblocked: the metrics follow, and the claim loop wakes.
func (d *Drainer) brokerChanged() {
	d.showBroker()
	d.poke()
}

// showBroker follows the broker connection into the metrics. The claim
// loop's own connects and closes call it without a wake-up, which would
// cost the next notification its claim at once (see WakeCoalesce).
func (d *Drainer) showBroker() {
	b := d.current.Load()
	d.metrics.BrokerConnected.Set(boolGauge(b != nil && b.Healthy()))
	d.metrics.BrokerBlocked.Set(boolGauge(b != nil && b.Blocked()))
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Run drains until ctx ends. Then it stops claiming, waits for the confirms
// in flight, settles them, releases the rest, and returns within the
// shutdown timeout. The next claim and the settles run beside the
// publishing, so their round trips overlap it.
func (d *Drainer) Run(ctx context.Context) error {
	if !d.releaseLeftovers(ctx) {
		return nil
	}
	// hardStop ends when shutdown allows no more waiting on the broker or on
	// the claim in flight: at the shutdown deadline less a reserve, which
	// the settles and the final release need. Confirms still awaited are
	// then given up, the claim is cancelled, and the broker's socket fails
	// every read and write, so that a publish blocked on a full socket (a
	// broker's memory alarm) returns.
	hardStop, stopHard := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHard()
	reserve := min(d.cfg.ShutdownTimeout/4, 5*time.Second)
	shutdown := make(chan time.Time, 1)
	defer context.AfterFunc(ctx, func() {
		d.liveness.stopping.Store(true)
		deadline := time.Now().Add(d.cfg.ShutdownTimeout)
		shutdown <- deadline
		time.AfterFunc(time.Until(deadline.Add(-reserve)), stopHard)
	})()

	var background sync.WaitGroup
	bgCtx, stopBackground := context.WithCancel(ctx)
	listening := make(chan struct{})
	background.Go(func() { d.listen(bgCtx, listening) })
	background.Go(func() { d.followRotations(bgCtx) })
	// The first claim waits for the LISTEN, so that it finds every row
	// inserted before the session was up, and no wake-up is needed to catch
	// up. It waits no longer than a poll: the poll would claim by then.
	d.liveness.beat(d.cfg.PollInterval)
	select {
	case <-listening:
	case <-time.After(d.cfg.PollInterval):
	case <-ctx.Done():
	}
	if d.cfg.Retention.enabled() {
		background.Go(func() { d.pruneLoop(bgCtx) })
	}
	background.Go(func() { d.shelveLoop(bgCtx) })
	if d.store.Table().Ordered() {
		background.Go(func() { d.sweepLoop(bgCtx) })
	}
	settleCtx, stopSettling := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSettling()
	settle := make(chan *batch, maxSettleGroup)
	var settler sync.WaitGroup
	settler.Go(func() { d.settleLoop(settleCtx, settle) })

	p := &pipeline{d: d, settle: settle, hardStop: hardStop.Done()}
	d.claimLoop(ctx, hardStop, p)

	// The claim loop returns only once ctx has ended.
	deadline := <-shutdown
	p.drain()
	close(settle)
	defer time.AfterFunc(time.Until(deadline.Add(-reserve/2)), stopSettling).Stop()
	settler.Wait()
	// Whatever is still claimed under this ID is in flight no more: a
	// settle that gave up, or a claim that finished after shutdown began.
	releaseCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(-reserve/4))
	defer cancel()
	if n, err := d.store.ReleaseHeld(releaseCtx, d.cfg.DrainerID, d.cfg.LeaseTTL, nil); err != nil {
		d.log.Error("Releasing claims at shutdown failed; they expire with their lease", "error", err)
	} else if n > 0 {
		d.log.Info("Released claims at shutdown", "rows", n)
	}
	stopBackground()
	background.Wait()
	if d.broker != nil {
		d.broker.Close()
	}
	d.log.Info("Drainer stopped")
	return nil
}

// releaseLeftovers frees the claims a previous process left under this
// drainer ID, retrying until the database answers. False means ctx ended.
func (d *Drainer) releaseLeftovers(ctx context.Context) bool {
	n, err := retry(ctx, d.log, "Database unavailable at start; retrying", func() (int64, error) {
		n, err := d.store.ReleaseHeld(ctx, d.cfg.DrainerID, d.cfg.LeaseTTL, nil)
		if err != nil {
			d.refusals.failed(statementRelease, err, time.Now())
		}
		return n, err
	}, d.liveness.beat)
	d.refusals.succeeded(statementRelease)
	if err != nil {
		return false
	}
	if n > 0 {
		d.log.Info("Released claims left by a previous process under this drainer ID", "rows", n)
	}
	return true
}

// listen keeps a LISTEN session on the table's notify channel, so inserted
// rows are claimed at once instead of at the next poll. Without the trigger
// nothing is ever notified, and the poll does the work. first is closed once
// the first session is up, or has failed.
func (d *Drainer) listen(ctx context.Context, first chan<- struct{}) {
	retry := newRetryBackoff()
	var once sync.Once
	claiming := false // the claim loop has started, so a new session must catch up
	onListening := func() {
		d.metrics.Listening.Set(1)
		if claiming {
			d.poke() // rows inserted while no session was listening
		}
		claiming = true
		once.Do(func() { close(first) })
	}
	for {
		started := time.Now()
		session, drop := context.WithCancel(ctx)
		d.dropListen.Store(&drop)
		err := d.store.Listen(session, d.cfg.Table, onListening, d.poke)
		drop()
		d.metrics.Listening.Set(0)
		claiming = true
		once.Do(func() { close(first) })
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, outbox.ErrNoSessions) {
			d.log.Info("Not listening for notifications: polling every --poll-interval", "reason", err, "pollInterval", d.cfg.PollInterval)
			return
		}
		if time.Since(started) > time.Minute {
			retry.Reset()
		}
		wait := retry.NextBackOff()
		d.log.Warn("Listen session lost; polling until it is back", "error", err, "retryIn", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// pruneLoop applies the retention windows every interval.
func (d *Drainer) pruneLoop(ctx context.Context) {
	r, table := d.cfg.Retention, d.store.Table()
	tick := time.NewTicker(r.Interval)
	defer tick.Stop()
	for {
		if r.Published != nil {
			if n := d.prune(ctx, "published", table.PrunePublished(*r.Published, r.BatchSize)); n > 0 {
				d.log.Info("Pruned published rows", "rows", n, "olderThan", r.Published.String())
			}
		}
		if r.UnpublishedMaxAge != nil {
			if n := d.prune(ctx, "unpublished", table.PruneUnpublished(*r.UnpublishedMaxAge, d.cfg.LeaseTTL, r.BatchSize)); n > 0 {
				d.log.Warn("Dropped unpublished rows past retention.unpublishedMaxAge; they were never published",
					"rows", n, "olderThan", r.UnpublishedMaxAge.String())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Spent rows are due rows that are not live: poisoned under an older
// maxAttempts, adopted with the table, or set back by hand. Claims pass over
// them, but each costs every claim a look until it is shelved, so a drainer
// shelves them at its start, which is when maxAttempts changes, and then
// every spentShelveInterval for those set back by hand. Each batch is a
// short transaction of its own, and the next follows at once.
const (
	spentShelveInterval = time.Minute
	spentShelveBatch    = 10_000
)

// shelveLoop shelves spent rows at start and every spentShelveInterval.
func (d *Drainer) shelveLoop(ctx context.Context) {
	tick := time.NewTicker(spentShelveInterval)
	defer tick.Stop()
	for {
		n, err := d.store.ShelveSpent(ctx, d.cfg.MaxAttempts, d.cfg.LeaseTTL, spentShelveBatch)
		d.metrics.Shelved.Add(float64(n))
		switch {
		case err != nil && ctx.Err() == nil:
			d.log.Error("Shelving spent rows failed; claims pass over them meanwhile, and the next try is in a minute", "shelved", n, "error", err)
		case n > 0:
			d.log.Info("Shelved spent rows: due, but at maxAttempts or parked; they count as poisoned or parked, and claims no longer pass over them",
				"rows", n, "maxAttempts", d.cfg.MaxAttempts)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// strandedSweepInterval is how often an ordered drainer looks for rows
// waiting behind a head that went without waking them (parked, deleted): at
// worst, that long after a park the key's next row goes.
const strandedSweepInterval = 15 * time.Second

// sweepLoop wakes stranded waiting rows every strandedSweepInterval.
func (d *Drainer) sweepLoop(ctx context.Context) {
	tick := time.NewTicker(strandedSweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n, err := d.store.WakeStranded(ctx, d.cfg.MaxAttempts, 1000)
		switch {
		case err != nil && ctx.Err() == nil:
			d.log.Error("Waking rows whose key's head is gone failed; retrying at the next sweep", "error", err)
		case n > 0:
			d.log.Info("Woke rows whose key's head went without a settle (parked or deleted)", "rows", n)
			d.poke()
		}
	}
}

// prune runs one retention statement until nothing is left to delete, and
// returns how many rows it deleted.
func (d *Drainer) prune(ctx context.Context, kind string, stmt outbox.Statement) int64 {
	n, err := d.store.Prune(ctx, stmt, d.cfg.Retention.BatchSize)
	d.metrics.Pruned.WithLabelValues(kind).Add(float64(n))
	if err != nil && ctx.Err() == nil {
		d.log.Error("Retention failed; retrying at the next interval", "kind", kind, "deleted", n, "error", err)
	}
	return n
}

// Ready reports why the drainer cannot drain right now, or nil: the
// database must not keep refusing its statements, nor answer read-only, the
// broker must be connected and not blocking, and the database must answer.
func (d *Drainer) Ready(ctx context.Context) error {
	if err := d.refusals.cause(); err != nil {
		return secret.RedactError(err, d.cfg.Database.URL)
	}
	switch b := d.current.Load(); {
	case b == nil || !b.Healthy():
		if why := d.dialFailure.Load(); why != nil {
			return fmt.Errorf("%s not connected: %s", d.cfg.sinkName(), *why)
		}
		return errors.New(d.cfg.sinkName() + " not connected")
	case b.Blocked():
		return errors.New("broker is blocking publishes (a memory or disk alarm in its cluster); claiming paused")
	}
	if err := d.store.Ping(ctx); err != nil {
		return fmt.Errorf("database: %w", secret.RedactError(err, d.cfg.Database.URL))
	}
	return nil
}

// Alive reports whether the claim loop is making progress: nil, or why
// /healthz fails. A drainer shutting down is alive: its loop has ended on
// purpose, and a liveness failure would kill it before it releases its
// claims.
func (d *Drainer) Alive() error {
	if over := d.liveness.overdue(time.Now()); over > 0 {
		return fmt.Errorf("claim loop has made no progress for %s longer than its waits and the lease (%s) allow", over.Round(time.Millisecond), d.cfg.LeaseTTL)
	}
	return nil
}

// retry runs op until it succeeds, returns a backoff.Permanent error, or ctx
// ends, waiting a jittered, exponentially growing time between tries and
// logging each failure as msg; waiting is told each wait before it starts.
func retry[T any](ctx context.Context, log *slog.Logger, msg string, op backoff.Operation[T], waiting ...func(time.Duration)) (T, error) {
	return backoff.Retry(ctx, op, backoff.WithBackOff(newRetryBackoff()), backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, wait time.Duration) {
			for _, w := range waiting {
				w(wait)
			}
			log.Error(msg, "error", err, "retryIn", wait)
		}))
}

func newRetryBackoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 30 * time.Second
	return b
}
