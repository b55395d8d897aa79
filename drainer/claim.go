package drainer

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-io/spillway/drainer/rabbitmq"
	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/drainer/webhook"
	"github.com/spillway-io/spillway/outbox"
)

// Phase 1: the claim, and the loop that drives the three phases.

// claimLoop claims and publishes. While a full batch is being published, the
// next one is already being claimed, so the pipeline does not run dry while
// a claim is in flight; and confirms are resolved while it waits for either.
// It returns once ctx has ended.
func (d *Drainer) claimLoop(ctx, hardStop context.Context, p *pipeline) {
	defer d.hush.Close()
	defer d.roster.Close()
	defer d.blockedFlag.Lower()
	retry := newRetryBackoff()
	var next *pendingClaim
	// followUp is set after a wake-up: rows whose transactions skipped
	// notifying, because another was notifying, may commit just after the
	// claim that the notification caused.
	followUp := false
	for ctx.Err() == nil {
		d.liveness.beat(0)
		if next == nil {
			if d.broker != nil && !d.brokerUsable() {
				// Confirms of a closed channel resolve at once; those of a
				// stale one are awaited before it is replaced.
				p.drain()
			}
			if err := d.connectBroker(ctx, hardStop); err != nil {
				return
			}
			if d.broker.Blocked() {
				// Rows claimed now could only be released; the unblock
				// wakes the loop.
				if err := d.blockedFlag.Raise(ctx); err != nil {
					d.log.Warn("Cannot show the operator that the broker blocks publishing", "error", err)
				}
				p.idle(ctx, d.cfg.PollInterval, d.wake)
				continue
			}
			d.blockedFlag.Lower()
			if wait := d.pushback.wait(); wait > 0 {
				d.log.Warn("Broker nacked publishes (a queue may be full with overflow reject-publish); rows released, claiming backs off",
					"retryIn", wait)
				p.sleep(ctx, wait)
				continue
			}
			next = d.claim(hardStop)
			next.woken = followUp
		}
		p.waitFor(next.done)
		c := next
		next = nil
		if c.err != nil {
			// Never longer than a poll: a drainer the database refused is
			// unready, and must be ready again within a poll of the cure.
			wait := min(retry.NextBackOff(), d.cfg.PollInterval)
			d.statementFailed(statementClaim, c.err)
			if outbox.ReadOnly(c.err) {
				d.leaveReadOnly()
			}
			if _, refused := outbox.Refused(c.err); !refused {
				d.releaseUnread(hardStop)
			}
			p.sleep(ctx, wait)
			continue
		}
		retry.Reset()
		d.statementSucceeded(statementClaim)
		full := c.claim.Full(c.size)
		if full && !d.cfg.SerialBatches && d.brokerUsable() && !d.broker.Blocked() && d.pushback.wait() == 0 {
			next = d.claim(hardStop)
		}
		if wait := d.rate.take(len(c.claim.Rows)); wait > 0 {
			// The rate cap: the rows wait under their lease, which the
			// claim's size keeps three times longer than the wait.
			p.sleep(ctx, wait)
		}
		if len(c.claim.Rows) > 0 {
			// Should the broker have failed since the claim, publish
			// releases the batch.
			b := d.publish(ctx, p, c)
			if d.cfg.SerialBatches {
				p.drain()
				<-b.settled
			}
		}
		if !full {
			wait := d.cfg.PollInterval
			switch letGo := d.followStream(ctx, c); {
			case d.hush.Held():
				// Commits do not notify: the next claim comes a window
				// after this one's start, as a notification's would.
				wait = max(time.Until(c.started.Add(d.cfg.WakeCoalesce)), 0)
			case followUp || letGo || c.claim.Deferred > 0:
				wait = min(wait, lateCommitWindow)
			}
			if followUp = p.idle(ctx, wait, d.wake); followUp {
				// Under a steady stream of commits every notification would
				// be a claim of a row or two and a settle: a storm of tiny
				// transactions in the application's database. Claims woken
				// by notifications start at most one per WakeCoalesce, and
				// the notifications in between share the next; a wake-up
				// after a quiet spell is claimed at once.
				if gap := time.Until(c.started.Add(d.cfg.WakeCoalesce)); gap > 0 {
					p.sleep(ctx, gap)
				}
			}
		}
	}
	if next != nil {
		// Shutdown: publish releases a batch claimed ahead.
		if <-next.done; next.err != nil {
			d.releaseUnread(hardStop)
		} else if len(next.claim.Rows) > 0 {
			d.publish(ctx, p, next)
		}
	}
}

// followStream hushes the table's notifications while claims find rows
// that commits keep bringing, and lets go once a claim finds none. It
// reports whether it let go: commits that skipped notifying may land just
// after the claim, and the next must follow soon. Only a notification
// starts a hush, so a table without the trigger is polled as before; with
// no coalescing window, every notification is claimed, as asked.
func (d *Drainer) followStream(ctx context.Context, c *pendingClaim) (letGo bool) {
	found := len(c.claim.Rows) > 0
	switch {
	case found && (c.woken || d.hush.Held()) && d.cfg.WakeCoalesce > 0:
		if err := d.hush.Hush(ctx); err != nil {
			d.log.Warn("Could not hush notifications while claiming on its own; commits keep notifying, next try in a minute", "error", err)
		}
	case !found && d.hush.Held():
		if err := d.hush.Unhush(ctx); err != nil {
			d.log.Warn("Unhushing notifications failed; closed the session that held them", "error", err)
		}
		return true
	}
	return false
}

// lateCommitWindow is how soon a wake-up's claim is followed by another, and
// an ordered claim that left rows due while their key's head was settled.
const lateCommitWindow = 20 * time.Millisecond

// pendingClaim is one claim under way, of at most size rows; claim and err
// are set when done closes.
type pendingClaim struct {
	done    chan struct{}
	started time.Time
	// woken: the claim followed a notification.
	woken bool
	size  int
	claim outbox.Claimed
	err   error
	// span is the claim's span, invalid while tracing is off.
	span trace.SpanContext
}

// claim runs phase 1 in the background. Shutdown does not cancel the
// statement until the hard stop: a claim cut short could have committed,
// leaving rows held until their lease expires instead of released at once.
// Half a lease bounds it: a claim slower than that would leave too little
// of the lease to publish its rows.
func (d *Drainer) claim(hardStop context.Context) *pendingClaim {
	c := &pendingClaim{done: make(chan struct{}), started: time.Now()}
	go func() {
		defer close(c.done)
		ctx, cancel := context.WithTimeout(hardStop, d.cfg.LeaseTTL/2)
		defer cancel()
		if err := d.rate.refresh(ctx, time.Now(), d.countOthers); err != nil {
			d.log.Warn("Could not count the drainers sharing --max-rate; keeping this one's share until the next count",
				"error", err, "perSecond", d.rate.capShare())
		}
		d.metrics.RateShare.Set(d.rate.capShare())
		params := d.cfg.ClaimParams()
		params.BatchSize = d.rate.claimSize(params.BatchSize)
		c.size = params.BatchSize
		start := time.Now()
		ctx, span := d.startStatement(ctx, "claim", nil)
		c.claim, c.err = d.store.Claim(ctx, params)
		if span != nil {
			c.span = span.SpanContext()
			endStatement(span, len(c.claim.Rows), c.err)
		}
		if c.err == nil {
			if len(c.claim.Rows) > 0 {
				d.held.add(c.claim.Token)
			}
			d.metrics.ClaimDuration.Observe(time.Since(start).Seconds())
			d.metrics.BatchSize.Observe(float64(len(c.claim.Rows)))
			d.metrics.Claimed.Add(float64(len(c.claim.Rows)))
		}
	}()
	return c
}

// leaveReadOnly ends the sessions of the drainer's own, which the read-only
// server that refused a claim (a primary demoted in a switchover) may hold
// too: the store has dropped its pool's sessions, and each comes back on the
// primary. Claim loop only.
func (d *Drainer) leaveReadOnly() {
	d.hush.Close()
	d.roster.Close()
	d.blockedFlag.Lower()
	if drop := d.dropListen.Load(); drop != nil {
		(*drop)()
	}
}

// releaseUnread releases the rows of a claim that failed without an answer
// from the database: it may have committed with its result lost on the way
// back, and its rows would be held until their lease expires. Every claim of
// this drainer whose rows are not in phase 2 or 3 is such a claim.
func (d *Drainer) releaseUnread(hardStop context.Context) {
	ctx, cancel := context.WithTimeout(hardStop, d.cfg.LeaseTTL/2)
	defer cancel()
	n, err := d.store.ReleaseHeld(ctx, d.cfg.DrainerID, d.cfg.LeaseTTL, d.held.list())
	switch {
	case err != nil:
		d.log.Warn("Could not release the rows of the failed claim; if it committed, they are claimed again when their lease ends", "error", err)
	case n > 0:
		d.log.Info("Released the rows of a claim whose result was lost", "rows", n)
	}
}

// connectBroker makes d.broker a healthy channel, reconnecting with jittered
// backoff for as long as it takes. Nothing is claimed meanwhile, so rows are
// not claimed only to be released. It fails only when ctx ends.
func (d *Drainer) connectBroker(ctx, hardStop context.Context) error {
	if d.broker != nil && d.brokerUsable() {
		return nil
	}
	if d.broker != nil {
		switch {
		case !d.broker.Healthy():
			d.log.Warn("Broker channel closed; reconnecting")
		case d.rotateBroker.Load():
			d.log.Info("Reconnecting to the broker with the changed URL file")
		case d.pushback.redial:
			d.log.Info("Replacing the broker connection, whose publishes were nacked")
		default:
			d.log.Info("Replacing the broker channel, which gave up a confirm while the broker blocked it")
		}
		d.broker.Close()
		d.broker = nil
		d.current.Store(nil)
		d.showBroker()
	}
	// The dial reads the URL file afresh.
	d.rotateBroker.Store(false)
	d.pushback.redial = false
	b, err := retry(ctx, d.log, d.cfg.sinkUnavailable(), func() (sink.Sink, error) {
		b, err := d.dialer.Dial(hardStop, d.brokerChanged)
		if err != nil {
			why := err.Error()
			d.dialFailure.Store(&why)
		}
		return b, err
	}, d.liveness.beat)
	if err != nil {
		return err
	}
	d.log.Info("Connected to "+d.cfg.sinkName(), "to", d.dialer.Where())
	d.broker = b
	d.dialFailure.Store(nil)
	d.current.Store(&openSink{b})
	d.showBroker()
	return nil
}

// dialerOf is the dialer of the sink cfg names: the webhook, when set, or
// the broker.
func dialerOf(cfg Config, payloadType string, metrics *Metrics, log *slog.Logger) sink.Dialer {
	cfg.Broker.Format = cfg.Format
	if cfg.Webhook != nil {
		cfg.Webhook.Format = cfg.Format
		d := webhook.NewDialer(*cfg.Webhook, cfg.PipelineDepth, cfg.MaxPayloadBytes, payloadType)
		d.Observe = func(class string, took time.Duration) {
			metrics.WebhookResponses.WithLabelValues(class).Inc()
			metrics.WebhookDuration.Observe(took.Seconds())
		}
		return d
	}
	return rabbitmq.NewDialer(cfg.Broker, cfg.DrainerID, cfg.PipelineDepth, cfg.MaxPayloadBytes, payloadType, log)
}

// brokerUsable reports whether d.broker may publish: open, not due for a
// reconnect (a changed URL file, nacks), and not stale, unless the broker
// still blocks it (a new connection would block too).
func (d *Drainer) brokerUsable() bool {
	return d.broker.Healthy() && !d.rotateBroker.Load() && !d.pushback.redial && (!d.broker.Stale() || d.broker.Blocked())
}

// pushback is the claim loop's backoff after the broker nacked publishes: a
// queue full with overflow reject-publish, or the broker refusing for a
// reason of its own. That is the broker saying no, not the rows being bad,
// so they are released without an attempt counted; claiming them again at
// once would only be refused again. The next ack ends it. Claim loop only.
type pushback struct {
	backoff *backoff.ExponentialBackOff
	until   time.Time
	// redial is set when a backoff starts: the connection is replaced
	// before the next claim. A channel that RabbitMQ 3.10 opened while a
	// quorum queue elected its leader nacks every publish to it for as long
	// as it lives, while a new one is accepted; a full queue's nacks cost
	// one reconnect per backoff.
	redial bool
}

// nacked backs off claiming, longer each time the claims after a backoff are
// nacked again; nacks of rows already in flight do not add to it.
func (pb *pushback) nacked() {
	if now := time.Now(); !now.Before(pb.until) {
		pb.until = now.Add(pb.backoff.NextBackOff())
		pb.redial = true
	}
}

// acked ends the backoff.
func (pb *pushback) acked() {
	pb.backoff.Reset()
	pb.until = time.Time{}
}

// wait is how long claiming stays backed off.
func (pb *pushback) wait() time.Duration { return max(time.Until(pb.until), 0) }

// heldClaims counts the claims whose rows are in phase 2 or 3, by token.
type heldClaims struct {
	mu     sync.Mutex
	tokens map[int64]int // token in microseconds, the database's precision
}

func (h *heldClaims) add(token time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tokens[token.UnixMicro()]++
}

func (h *heldClaims) remove(token time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.tokens[token.UnixMicro()]--; h.tokens[token.UnixMicro()] <= 0 {
		delete(h.tokens, token.UnixMicro())
	}
}

func (h *heldClaims) list() []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]time.Time, 0, len(h.tokens))
	for t := range h.tokens {
		out = append(out, time.UnixMicro(t))
	}
	return out
}
