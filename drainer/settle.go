package drainer

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// Phase 3: settling each batch's outcomes in the table.

// maxLastErrorLength is how much of a failure's detail last_error keeps.
const maxLastErrorLength = 1000

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
			d.held.remove(b.claim.Token)
			close(b.settled)
		}
	}
}

// settlementOf groups the rows of batches by outcome. On an ordered table,
// a published row lets its key's next row go, and so does a failed one when
// failures skip (it is poisoned at once); a released row stays its key's
// head, and so does a failed one when failures block.
func settlementOf(group []*batch, skip bool) outbox.Settlement {
	var st outbox.Settlement
	rows := 0
	for _, b := range group {
		rows += len(b.outcomes)
	}
	st.Published = make([]outbox.Lease, 0, rows) // most rows are published
	for _, b := range group {
		for i, o := range b.outcomes {
			lease, key := b.claim.Lease(i), b.claim.Rows[i].Key
			switch o.kind {
			case published:
				st.Published = append(st.Published, lease)
			case failed:
				st.Failed = append(st.Failed, lease)
				st.Failures = append(st.Failures, outbox.Failure{Reason: secret.Truncate(o.detail, maxLastErrorLength), RetryAfter: o.retryAfter, Poison: o.poison})
			case released:
				st.Released = append(st.Released, lease)
			}
			if key != nil && (o.kind == published || (o.kind == failed && skip)) {
				st.Advanced = append(st.Advanced, *key)
			}
		}
	}
	return st
}

// settle is phase 3, retried until the lease would have expired anyway: past
// that, the rows are another claim's to publish again.
func (d *Drainer) settle(ctx context.Context, group []*batch) {
	st := settlementOf(group, d.cfg.Table.Ordering.Skips())
	st.DeletePublished = d.cfg.Retention.deletesPublished()
	st.TimeCommit = d.guard.due(time.Now())
	ctx, cancel := context.WithTimeout(ctx, d.cfg.LeaseTTL)
	defer cancel()
	tries := 0
	// Never longer than a poll between tries: a drainer the database
	// refused is unready, and must be ready again within a poll of the cure.
	every := newRetryBackoff()
	every.MaxInterval = min(every.MaxInterval, d.cfg.PollInterval*2/3) // and its jitter of a half
	var links []trace.Link
	for _, b := range group {
		if b.span.IsValid() {
			links = append(links, trace.Link{SpanContext: b.span})
		}
	}
	ctx, span := d.startStatement(ctx, "settle", links)
	done, err := backoff.Retry(ctx, func() (outbox.Settled, error) {
		tries++
		done, err := d.store.Settle(ctx, d.cfg.DrainerID, st, d.cfg.failurePolicy())
		if err != nil {
			d.statementFailed(statementSettle, err)
		} else {
			d.statementSucceeded(statementSettle)
		}
		return done, err
	}, backoff.WithBackOff(every), backoff.WithMaxElapsedTime(0))
	endStatement(span, int(done.Published+done.Failed+done.Released), err)
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
	if done.Woken > 0 {
		// Rows of the settled keys are due now: the claim loop need not
		// wait for its poll.
		d.poke()
	}
	d.pace(st, done)
	d.metrics.Published.Add(float64(done.Published))
	if done.Published > 0 {
		d.metrics.LastPublish.SetToCurrentTime()
	}
	lost := int64(len(st.Published)+len(st.Failed)+len(st.Released)) - done.Published - done.Failed - done.Released
	if lost > 0 && tries > 1 {
		// The failed try may have committed before its connection broke:
		// those rows are settled already, or taken over; no telling which.
		d.log.Warn("Settle retried; some rows were already settled by the ambiguous try or claimed again",
			"rows", lost, "tries", tries)
	} else if lost > 0 {
		d.metrics.LeaseLost.Add(float64(lost))
		d.log.Warn("Lease lost: the rows' leases expired and they were claimed again, so this settle left them alone",
			"rows", lost, "published", len(st.Published), "marked", done.Published)
	}
}

// pace feeds the commit guard one settle: its rows, and its commit when
// timed. A settle that changed no row wrote no WAL, so its commit flushed
// nothing and says nothing of the database's.
func (d *Drainer) pace(st outbox.Settlement, done outbox.Settled) {
	if d.guard == nil {
		return
	}
	now, rows := time.Now(), done.Published+done.Failed+done.Released
	d.guard.settled(now, int(rows))
	if !st.TimeCommit || rows == 0 {
		return
	}
	d.metrics.CommitLatency.Observe(done.Commit.Seconds())
	before := d.guard.pace
	pace, cut := d.guard.observe(now, done.Commit)
	if cut {
		// Counted before the gauge shows the pace it led to.
		d.metrics.CommitPaceCuts.Inc()
	}
	d.rate.setPace(pace)
	d.metrics.CommitPace.Set(pace)
	if cut && pace == minGuardedPace && before > minGuardedPace {
		// Once on reaching it: at the slowest pace, every slow commit cuts
		// again, three times a second.
		d.log.Warn("Commits take longer than --max-commit-latency even at the slowest pace; draining at it until they are faster",
			"commit", done.Commit, "maxCommitLatency", d.cfg.MaxCommitLatency, "perSecond", pace)
	}
}
