package drainer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spillway-io/spillway/drainer/sink"
)

// Phase 2: publishing a claim's rows, and classifying each confirm.

// publish is phase 2 for one batch, claimed at c.started (by this drainer's
// clock, before the claim's statement went out). Every row enters the
// pipeline, published or with its outcome already known.
func (d *Drainer) publish(ctx context.Context, p *pipeline, c *pendingClaim) *batch {
	bt := &batch{claim: c.claim, outcomes: make([]outcome, len(c.claim.Rows)), settled: make(chan struct{}), span: c.span}
	claimed := c.started
	// The publish itself must not be cut by shutdown: a half-written frame
	// would close the channel under the in-flight confirms. The hard stop
	// cuts the socket instead.
	publishCtx := context.WithoutCancel(ctx)
	// Once the channel fails or shutdown starts, the rest of the batch is released.
	var rest *outcome
	for i := range bt.claim.Rows {
		row := &bt.claim.Rows[i]
		e := inflight{batch: bt, index: i}
		if rest == nil && ctx.Err() != nil {
			rest = &outcome{kind: released, reason: releaseShutdown}
		}
		if rest == nil && d.broker.Blocked() {
			// Publishes would pile up unread in the socket.
			rest = &outcome{kind: released, reason: releaseBrokerBlocked}
		}
		if rest == nil && !d.broker.Healthy() {
			// The channel closed under the batch (a lost confirm drained
			// while making room): the rest waits for the next connection.
			rest = &outcome{kind: released, reason: releaseBrokerUnavailable}
		}
		if rest != nil {
			e.outcome = *rest
			p.add(e)
			continue
		}
		tc, span := d.startPublish(row, bt.span)
		e.span = span
		msg, fault := d.broker.Prepare(*row, tc)
		// The message holds the payload until it is written; the batch
		// keeps only what phase 3 needs, so memory follows the rows not yet
		// published, not the rows not yet settled.
		row.Payload, row.Headers = nil, nil
		if fault != nil {
			e.outcome = outcome{kind: failed, reason: fault.Reason, detail: fault.Detail}
			p.add(e)
			continue
		}
		e.size = msg.Size()
		// A row that was in flight when the connection failed is published
		// alone, with nothing else in flight, until it is confirmed: should
		// the connection fail again, the failure is the row's.
		if e.alone = d.strikes.suspect(row.ID); e.alone {
			p.drain()
		} else {
			p.makeRoom(d.cfg.PipelineDepth, d.cfg.MaxPipelineBytes, e.size)
		}
		// The confirms resolved while waiting may have closed the channel.
		if !d.broker.Healthy() {
			rest = &outcome{kind: released, reason: releaseBrokerUnavailable}
			e.outcome = *rest
			p.add(e)
			continue
		}
		if d.leaseEnding(claimed) {
			rest = &outcome{kind: released, reason: releaseLeaseEnding}
			e.outcome = *rest
			p.add(e)
			continue
		}
		e.publishedAt = time.Now()
		delivery, err := d.broker.Publish(publishCtx, msg)
		switch {
		case err == nil:
			e.delivery, e.sink = delivery, d.broker
		case errors.Is(err, sink.ErrDown):
			d.log.Error("Publish failed; releasing the rest of the batch", "error", err)
			rest = &outcome{kind: released, reason: releaseBrokerUnavailable}
			e.outcome = *rest
		default:
			// What the row holds closed the connection: the failure is
			// this row's.
			d.log.Error("Publish failed; releasing the rest of the batch", "error", err)
			rest = &outcome{kind: released, reason: releaseBrokerUnavailable}
			e.alone = true
			e.outcome = d.connectionFailure(e, err.Error(), releaseBrokerUnavailable)
		}
		p.add(e)
		if e.alone {
			p.drain()
		}
	}
	if d.broker != nil {
		d.broker.Flush()
	}
	return bt
}

// leaseEnding says that a row claimed at claimed may no longer be published:
// its outcome, awaited for up to the confirm timeout, and its settle would
// come after its lease ends, when another claim may have taken it and
// published it again. Sending it then makes a duplicate for certain, where
// releasing it costs one claim more. The lease rule keeps a batch of quick
// publishes well inside its lease; this is for slow ones: a receiver that
// takes each request to its timeout, with few requests in flight.
func (d *Drainer) leaseEnding(claimed time.Time) bool {
	return time.Until(claimed.Add(d.cfg.LeaseTTL)) < d.cfg.confirmTimeout()+d.cfg.LeaseTTL/10
}

// classify turns a publish whose outcome arrived, or whose deadline passed,
// into its outcome; timedOut is the release reason for the latter.
func (d *Drainer) classify(e inflight, timedOut string) outcome {
	select {
	case <-e.delivery.Done():
	default:
		e.delivery.GiveUp(timedOut == releaseConfirmTimeout)
		return outcome{kind: released, reason: timedOut}
	}
	o := e.delivery.Outcome()
	switch o.Kind {
	case sink.Lost:
		return d.connectionFailure(e, o.Detail, releaseConfirmLost)
	case sink.PushedBack:
		d.pushback.nacked()
		return outcome{kind: released, reason: releaseNack}
	}
	d.pushback.acked()
	d.strikes.clear(e.batch.claim.Rows[e.index].ID)
	d.metrics.ConfirmLatency.Observe(time.Since(e.publishedAt).Seconds())
	if o.Kind == sink.Refused {
		return outcome{kind: failed, reason: o.Reason, detail: o.Detail, retryAfter: o.RetryAfter, poison: o.Poison}
	}
	return outcome{kind: published}
}

// connectionFailure is the outcome of a row in flight when the broker's
// channel or connection failed with cause: released without an attempt,
// unless the row has now been in flight alone through strikesToFail such
// failures in a row. A row in flight with others only becomes a suspect: the
// broker withholds the acks of the rows before the one it refuses when it
// closes the channel, so which row failed cannot be told.
func (d *Drainer) connectionFailure(e inflight, cause, reason string) outcome {
	id := e.batch.claim.Rows[e.index].ID
	if n := d.strikes.add(id, e.alone); n >= strikesToFail {
		d.strikes.clear(id)
		return outcome{kind: failed, reason: reasonConnectionFailures, detail: fmt.Sprintf(
			"in flight, alone, through %d consecutive broker connection failures: the row breaks the connection (last: %s)", n, cause)}
	}
	return outcome{kind: released, reason: reason}
}

// reasonConnectionFailures is the failure reason, a metric label, of a row
// in flight, alone, through strikesToFail consecutive connection failures.
const reasonConnectionFailures = "connection_failures"

// strikesToFail is how many consecutive broker connection failures a row may
// be in flight through, alone, before an attempt is counted against it. A row
// can close the connection in ways no check before publishing catches (a
// payload over the broker's max_message_size, a topic permission refused);
// released each time, it would come back for ever, and take the rows
// published beside it down with it, as duplicates.
const strikesToFail = 3

// maxStrikes bounds the rows remembered; a row published by another drainer
// is never cleared here, so old entries are swept.
const (
	maxStrikes   = 10_000
	strikeMaxAge = 10 * time.Minute
)

// strikes holds the suspects: the rows that were in flight when the
// connection failed, with the failures each was in flight through alone. An
// ack clears a row. Claim loop only.
type strikes map[string]strike

type strike struct {
	alone int
	last  time.Time
}

// suspect reports whether id was in flight when the connection failed.
func (s strikes) suspect(id string) bool {
	_, ok := s[id]
	return ok
}

// add records a failure id was in flight through, counted if it was alone,
// and returns the count.
func (s strikes) add(id string, alone bool) int {
	if len(s) >= maxStrikes {
		for k, v := range s {
			if time.Since(v.last) > strikeMaxAge {
				delete(s, k)
			}
		}
		if len(s) >= maxStrikes {
			clear(s)
		}
	}
	st := s[id]
	if alone {
		st.alone++
	}
	st.last = time.Now()
	s[id] = st
	return st.alone
}

func (s strikes) clear(id string) { delete(s, id) }
