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
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// outcomeKind is what phase 3 does with a row.
type outcomeKind int

const (
	// published: the broker acked it.
	published outcomeKind = iota
	// failed: the broker refused it or the row cannot be published; the row
	// is at fault, so an attempt is counted and it backs off.
	failed
	// released: the outcome is unknown or the broker is unavailable. The row
	// did nothing wrong, so no attempt is counted: a duplicate is possible, a
	// loss is not.
	released
)

// Release reasons, used as metric labels.
const (
	releaseConfirmLost       = "confirm_lost"
	releaseConfirmTimeout    = "confirm_timeout"
	releaseBrokerUnavailable = "broker_unavailable"
	releaseBrokerBlocked     = "broker_blocked"
	releaseShutdown          = "shutdown"
)

type outcome struct {
	kind   outcomeKind
	reason string // metric label, for failed and released
	detail string // last_error, for failed
}

// batch is one claim's rows and, once confirmed, their outcomes.
type batch struct {
	rows     []Row
	outcomes []outcome
	// settled is closed once phase 3 is done with the batch.
	settled chan struct{}
}

// Drainer runs the three-phase loop for one drainer ID.
type Drainer struct {
	cfg         Config
	store       *Store
	metrics     *Metrics
	log         *slog.Logger
	contentType string
	// broker is owned by the goroutine running the claim loop; current is
	// the same channel, for the readiness probe.
	broker  *brokerChannel
	current atomic.Pointer[brokerChannel]
	// wake cuts an idle wait short: new rows were notified, or the broker's
	// state changed.
	wake chan struct{}
	// rotateBroker asks for a reconnect between batches: the broker URL
	// file changed.
	rotateBroker atomic.Bool
}

// New checks the config and returns a drainer over store.
func New(cfg Config, store *Store, metrics *Metrics, log *slog.Logger) (*Drainer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Retention.UnpublishedMaxAge != nil && !store.Table().HasEnqueuedAt() {
		return nil, field.Invalid(field.NewPath("retention", "unpublishedMaxAge"), cfg.Retention.UnpublishedMaxAge.String(),
			"needs an enqueuedAt column to age rows by, and "+store.Table().Name()+" has none")
	}
	contentType := cfg.ContentType
	if contentType == "" {
		contentType = contentTypeFor(store.Table().PayloadType())
	}
	return &Drainer{
		cfg:         cfg,
		store:       store,
		metrics:     metrics,
		log:         log.With("table", store.Table().Name()),
		contentType: contentType,
		wake:        make(chan struct{}, 1),
	}, nil
}

// poke wakes the claim loop if it is idle, or makes its next idle wait short.
func (d *Drainer) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run drains until ctx ends. Then it stops claiming, waits for the confirms
// in flight, settles them, releases the rest, and returns within the
// shutdown timeout. The next claim and the settles run beside the
// publishing, so their round trips overlap it.
func (d *Drainer) Run(ctx context.Context) error {
	if !d.releaseLeftovers(ctx) {
		return nil
	}
	shutdown := make(chan time.Time, 1)
	defer context.AfterFunc(ctx, func() { shutdown <- time.Now().Add(d.cfg.ShutdownTimeout) })()

	var background sync.WaitGroup
	bgCtx, stopBackground := context.WithCancel(ctx)
	listening := make(chan struct{})
	background.Go(func() { d.listen(bgCtx, listening) })
	background.Go(func() { d.followRotations(bgCtx) })
	// The first claim waits for the LISTEN, so that it finds every row
	// inserted before the session was up, and no wake-up is needed to catch
	// up. It waits no longer than a poll: the poll would claim by then.
	select {
	case <-listening:
	case <-time.After(d.cfg.PollInterval):
	case <-ctx.Done():
	}
	if d.cfg.Retention.enabled() {
		background.Go(func() { d.pruneLoop(bgCtx) })
	}
	settleCtx, stopSettling := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSettling()
	settle := make(chan *batch, maxSettleGroup)
	var settler sync.WaitGroup
	settler.Go(func() { d.settleLoop(settleCtx, settle) })

	p := &pipeline{d: d, settle: settle}
	d.claimLoop(ctx, p)

	// The claim loop returns only once ctx has ended. The confirms may use
	// the shutdown timeout but for a reserve, which the settles and the
	// final release need.
	deadline := <-shutdown
	reserve := min(d.cfg.ShutdownTimeout/4, 5*time.Second)
	p.stopBy = deadline.Add(-reserve)
	p.drain()
	close(settle)
	defer time.AfterFunc(time.Until(deadline.Add(-reserve/2)), stopSettling).Stop()
	settler.Wait()
	// Whatever is still claimed under this ID is in flight no more: a
	// settle that gave up, or a claim that finished after shutdown began.
	releaseCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(-reserve/4))
	defer cancel()
	if n, err := d.store.ReleaseAll(releaseCtx, d.cfg.DrainerID); err != nil {
		d.log.Error("Releasing claims at shutdown failed; they expire with their lease", "error", err)
	} else if n > 0 {
		d.log.Info("Released claims at shutdown", "rows", n)
	}
	stopBackground()
	background.Wait()
	if d.broker != nil {
		d.broker.close()
	}
	d.log.Info("Drainer stopped")
	return nil
}

// releaseLeftovers frees the claims a previous process left under this
// drainer ID, retrying until the database answers. False means ctx ended.
func (d *Drainer) releaseLeftovers(ctx context.Context) bool {
	n, err := retry(ctx, d.log, "Database unavailable at start; retrying", func() (int64, error) {
		return d.store.ReleaseAll(ctx, d.cfg.DrainerID)
	})
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
		err := d.store.Listen(ctx, d.cfg.Table, onListening, d.poke)
		d.metrics.Listening.Set(0)
		claiming = true
		once.Do(func() { close(first) })
		if ctx.Err() != nil {
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

// prune runs one retention statement until nothing is left to delete, and
// returns how many rows it deleted.
func (d *Drainer) prune(ctx context.Context, kind string, stmt Statement) int64 {
	n, err := d.store.Prune(ctx, stmt, d.cfg.Retention.BatchSize)
	d.metrics.Pruned.WithLabelValues(kind).Add(float64(n))
	if err != nil && ctx.Err() == nil {
		d.log.Error("Retention failed; retrying at the next interval", "kind", kind, "deleted", n, "error", err)
	}
	return n
}

// Ready reports why the drainer cannot drain right now, or nil: the broker
// must be connected and not blocking, and the database must answer.
func (d *Drainer) Ready(ctx context.Context) error {
	switch b := d.current.Load(); {
	case b == nil || !b.healthy():
		return errors.New("broker not connected")
	case b.blocked():
		return errors.New("broker is blocking publishes (resource alarm)")
	}
	if err := d.store.Ping(ctx); err != nil {
		return fmt.Errorf("database: %w", RedactError(err, d.cfg.Database.URL))
	}
	return nil
}

// claimLoop claims and publishes. While a full batch is being published, the
// next one is already being claimed, so the pipeline does not run dry while
// a claim is in flight; and confirms are resolved while it waits for either.
func (d *Drainer) claimLoop(ctx context.Context, p *pipeline) {
	retry := newRetryBackoff()
	var next *pendingClaim
	// followUp is set after a wake-up: rows whose transactions skipped
	// notifying, because another was notifying, may commit just after the
	// claim that the notification caused.
	followUp := false
	for ctx.Err() == nil {
		if next == nil {
			if d.broker != nil && (!d.broker.healthy() || d.rotateBroker.Load()) {
				// Confirms of a closed channel resolve at once; those of a
				// channel about to be replaced come back first.
				p.drain()
			}
			if err := d.connectBroker(ctx); err != nil {
				return
			}
			if d.broker.blocked() {
				// Rows claimed now could only be released; the unblock
				// wakes the loop.
				p.idle(ctx, d.cfg.PollInterval, d.wake)
				continue
			}
			next = d.claim(ctx)
		}
		p.waitFor(next.done)
		c := next
		next = nil
		if c.err != nil {
			wait := retry.NextBackOff()
			d.log.Error("Claim failed", "error", c.err, "retryIn", wait)
			p.sleep(ctx, wait)
			continue
		}
		retry.Reset()
		full := len(c.rows) == d.cfg.BatchSize
		if full && !d.cfg.SerialBatches && d.broker.healthy() && !d.broker.blocked() && !d.rotateBroker.Load() {
			next = d.claim(ctx)
		}
		if len(c.rows) > 0 {
			// Should the broker have failed since the claim, publish
			// releases the batch.
			b := d.publish(ctx, p, c.rows)
			if d.cfg.SerialBatches {
				p.drain()
				<-b.settled
			}
		}
		if !full {
			wait := d.cfg.PollInterval
			if followUp {
				wait = min(wait, lateCommitWindow)
			}
			followUp = p.idle(ctx, wait, d.wake)
		}
	}
	if next != nil {
		// Shutdown: publish releases a batch claimed ahead.
		if <-next.done; len(next.rows) > 0 {
			d.publish(ctx, p, next.rows)
		}
	}
}

// lateCommitWindow is how soon a wake-up's claim is followed by another.
const lateCommitWindow = 20 * time.Millisecond

// pendingClaim is one claim under way; rows and err are set when done closes.
type pendingClaim struct {
	done chan struct{}
	rows []Row
	err  error
}

// claim runs phase 1 in the background. Shutdown does not cancel the
// statement: a claim cut short could have committed, leaving rows held until
// their lease expires instead of released at once. A claim that outlives the
// lease is pointless anyway, which bounds it.
func (d *Drainer) claim(ctx context.Context) *pendingClaim {
	c := &pendingClaim{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.LeaseTTL)
		defer cancel()
		start := time.Now()
		c.rows, c.err = d.store.Claim(ctx, d.cfg.ClaimParams())
		if c.err == nil {
			d.metrics.ClaimDuration.Observe(time.Since(start).Seconds())
			d.metrics.BatchSize.Observe(float64(len(c.rows)))
			d.metrics.Claimed.Add(float64(len(c.rows)))
		}
	}()
	return c
}

// connectBroker makes d.broker a healthy channel, reconnecting with jittered
// backoff for as long as it takes. Nothing is claimed meanwhile, so rows are
// not claimed only to be released. It fails only when ctx ends.
func (d *Drainer) connectBroker(ctx context.Context) error {
	rotate := d.rotateBroker.Swap(false)
	if d.broker != nil && d.broker.healthy() && !rotate {
		return nil
	}
	if d.broker != nil {
		d.broker.close()
		d.broker = nil
		d.current.Store(nil)
		if !rotate {
			d.log.Warn("Broker channel closed; reconnecting")
		}
	}
	b, err := retry(ctx, d.log, "Broker unavailable; claiming paused", func() (*brokerChannel, error) {
		return dialBroker(d.cfg.Broker, d.cfg.DrainerID, d.cfg.PipelineDepth, d.log, d.poke)
	})
	if err != nil {
		return err
	}
	d.log.Info("Connected to broker", "exchange", d.cfg.Broker.Exchange)
	d.broker = b
	d.current.Store(b)
	return nil
}

// publish is phase 2 for one batch. Every row enters the pipeline,
// published or with its outcome already known.
func (d *Drainer) publish(ctx context.Context, p *pipeline, rows []Row) *batch {
	bt := &batch{rows: rows, outcomes: make([]outcome, len(rows)), settled: make(chan struct{})}
	// Once the channel fails or shutdown starts, the rest of the batch is released.
	var rest *outcome
	for i, row := range rows {
		e := inflight{batch: bt, index: i}
		if rest == nil && ctx.Err() != nil {
			rest = &outcome{kind: released, reason: releaseShutdown}
		}
		if rest == nil && d.broker.blocked() {
			// Publishes would pile up unread in the socket.
			rest = &outcome{kind: released, reason: releaseBrokerBlocked}
		}
		if rest != nil {
			e.outcome = *rest
			p.add(e)
			continue
		}
		key, msg, fault := buildMessage(row, d.contentType, d.cfg.MaxPayloadBytes)
		if fault != nil {
			e.outcome = outcome{kind: failed, reason: fault.reason, detail: fault.detail}
			p.add(e)
			continue
		}
		p.makeRoom(d.cfg.PipelineDepth)
		e.publishedAt = time.Now()
		// The publish itself must not be cut by shutdown: a half-written
		// frame would close the channel under the in-flight confirms.
		dc, err := d.broker.publish(context.WithoutCancel(ctx), key, msg)
		if err != nil {
			d.log.Error("Publish failed; releasing the rest of the batch", "error", err)
			rest = &outcome{kind: released, reason: releaseBrokerUnavailable}
			e.outcome = *rest
		} else {
			e.confirm, e.broker = dc, d.broker
		}
		p.add(e)
	}
	return bt
}

// classify turns a publish whose confirm arrived, or whose deadline passed,
// into its outcome; timedOut is the release reason for the latter.
func (d *Drainer) classify(e inflight, timedOut string) outcome {
	select {
	case <-e.confirm.Done():
	default:
		// A channel that stalls past the deadline is not trusted again, and
		// the claim loop reconnects; unless the broker blocked it, which
		// explains the stall, and a new connection would only block again.
		if !e.broker.blocked() {
			e.broker.close()
		}
		return outcome{kind: released, reason: timedOut}
	}
	if !e.confirm.Acked() {
		if e.broker.ch.IsClosed() {
			// amqp091 resolves pending confirms as nacks when the channel
			// closes: that is a lost confirm, not the broker's refusal.
			return outcome{kind: released, reason: releaseConfirmLost}
		}
		return outcome{kind: failed, reason: reasonNack, detail: "broker nacked the message (a queue may be full with overflow reject-publish)"}
	}
	d.metrics.ConfirmLatency.Observe(time.Since(e.publishedAt).Seconds())
	if ret, ok := e.broker.takeReturn(e.batch.rows[e.index].ID); ok {
		return outcome{kind: failed, reason: reasonReturned,
			detail: fmt.Sprintf("broker returned the message: %d %s (exchange %q, routing key %q)", ret.ReplyCode, ret.ReplyText, ret.Exchange, ret.RoutingKey)}
	}
	return outcome{kind: published}
}

// maxSettleGroup bounds how many completed batches one settle takes.
const maxSettleGroup = 16

// settleLoop settles batches as they complete. Batches that completed while
// the previous settle ran go into one round trip together: with a trickle of
// small claims, as LISTEN/NOTIFY brings, one round trip per claim would make
// phase 3 the bottleneck, and the claim loop would wait on it.
func (d *Drainer) settleLoop(ctx context.Context, settle <-chan *batch) {
	for b := range settle {
		group := []*batch{b}
	gather:
		for len(group) < maxSettleGroup {
			select {
			case b, ok := <-settle:
				if !ok {
					break gather
				}
				group = append(group, b)
			default:
				break gather
			}
		}
		d.settle(ctx, group)
		for _, b := range group {
			close(b.settled)
		}
	}
}

// settlementOf groups the rows of batches by outcome.
func settlementOf(group []*batch) Settlement {
	var st Settlement
	for _, b := range group {
		for i, o := range b.outcomes {
			id := b.rows[i].ID
			switch o.kind {
			case published:
				st.Published = append(st.Published, id)
			case failed:
				st.Failed = append(st.Failed, id)
				st.Reasons = append(st.Reasons, truncate(o.detail, maxLastErrorLength))
			case released:
				st.Released = append(st.Released, id)
			}
		}
	}
	return st
}

// settle is phase 3, retried until the lease would have expired anyway: past
// that, the rows are another drainer's to claim and publish again.
func (d *Drainer) settle(ctx context.Context, group []*batch) {
	st := settlementOf(group)
	ctx, cancel := context.WithTimeout(ctx, d.cfg.LeaseTTL)
	defer cancel()
	retryBackoff := Backoff{Initial: d.cfg.RetryInitial.Milliseconds(), Max: d.cfg.RetryMax.Milliseconds()}
	tries := 0
	done, err := retry(ctx, d.log, "Settle failed; retrying", func() (Settled, error) {
		tries++
		return d.store.Settle(ctx, d.cfg.DrainerID, st, retryBackoff)
	})
	if err != nil {
		d.log.Error("Settle gave up; the rows will be claimed again when their lease expires",
			"rows", len(st.Published)+len(st.Failed)+len(st.Released), "error", err)
		return
	}
	for _, b := range group {
		for _, o := range b.outcomes {
			switch o.kind {
			case failed:
				d.metrics.Failed.WithLabelValues(o.reason).Inc()
			case released:
				d.metrics.Released.WithLabelValues(o.reason).Inc()
			}
		}
	}
	d.metrics.Published.Add(float64(done.Published))
	if done.Published > 0 {
		d.metrics.LastPublish.SetToCurrentTime()
	}
	lost := int64(len(st.Published)+len(st.Failed)+len(st.Released)) - done.Published - done.Failed - done.Released
	if lost > 0 && tries > 1 {
		// The failed try may have committed before its connection broke:
		// those rows are settled already, or taken over; no telling which.
		d.log.Warn("Settle retried; some rows were already settled by the ambiguous try or taken over by another drainer",
			"rows", lost, "tries", tries)
	} else if lost > 0 {
		d.metrics.LeaseLost.Add(float64(lost))
		d.log.Warn("Lease lost: another drainer took over expired claims, so this settle left them alone",
			"rows", lost, "published", len(st.Published), "marked", done.Published)
	}
}

// retry runs op until it succeeds, returns a backoff.Permanent error, or ctx
// ends, waiting a jittered, exponentially growing time between tries and
// logging each failure as msg.
func retry[T any](ctx context.Context, log *slog.Logger, msg string, op backoff.Operation[T]) (T, error) {
	return backoff.Retry(ctx, op, backoff.WithBackOff(newRetryBackoff()), backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, wait time.Duration) { log.Error(msg, "error", err, "retryIn", wait) }))
}

func newRetryBackoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 30 * time.Second
	return b
}
