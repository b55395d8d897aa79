package drainer

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-io/spillway/drainer/sink"
)

// inflight is one row on its way from publish to settle. Rows leave the
// pipeline in publish order, so a batch is complete when its last row has.
type inflight struct {
	batch   *batch
	index   int
	outcome outcome
	// delivery is nil when the outcome was known without publishing.
	delivery    sink.Delivery
	sink        sink.Sink
	publishedAt time.Time
	// size is the message's payload bytes, counted against the pipeline's
	// byte budget until its confirm.
	size int64
	// alone: nothing else was in flight, so a connection failure before its
	// confirm is pinned on this row.
	alone bool
	// span is the row's publish span, nil while tracing is off.
	span trace.Span
}

// window is the rows in flight, oldest first: a queue that reuses its array.
// Taking entries off a slice's front would shrink its capacity until the
// next append copied the whole window, for every row published.
type window struct {
	entries []inflight
	head    int // the oldest entry's index
}

func (w *window) len() int { return len(w.entries) - w.head }

// oldest is the entry at the front; the window must not be empty.
func (w *window) oldest() inflight { return w.entries[w.head] }

func (w *window) push(e inflight) {
	if len(w.entries) == cap(w.entries) && w.head > 0 {
		// Full at the back with room at the front: move the entries down.
		n := copy(w.entries, w.entries[w.head:])
		clear(w.entries[n:])
		w.entries, w.head = w.entries[:n], 0
	}
	w.entries = append(w.entries, e)
}

// pop takes the oldest entry off; the window must not be empty.
func (w *window) pop() inflight {
	e := w.entries[w.head]
	w.entries[w.head] = inflight{} // so the array holds no batch it is done with
	if w.head++; w.head == len(w.entries) {
		w.entries, w.head = w.entries[:0], 0
	}
	return e
}

// pipeline is phase 2's window: the rows published and awaiting their
// confirm, oldest first. The goroutine that publishes also resolves the
// confirms, so an arriving confirm frees its slot with no hand-off between
// goroutines. On a machine shared with the broker and the database each
// hand-off waits for the OS to schedule a thread, and that wait showed up as
// confirm latency and lost throughput.
type pipeline struct {
	d        *Drainer
	inflight window
	confirms int   // entries awaiting a confirm
	bytes    int64 // their payload bytes
	settle   chan<- *batch
	// hardStop is closed when shutdown allows no more waiting: every confirm
	// still awaited is given up.
	hardStop <-chan struct{}
}

// add puts a row's entry at the back of the window.
func (p *pipeline) add(e inflight) {
	p.inflight.push(e)
	if e.delivery != nil {
		p.confirms++
		p.bytes += e.size
		p.d.metrics.InFlight.Set(float64(p.confirms))
	}
	p.passKnown()
}

// passKnown passes on the entries at the front whose outcome needs no confirm.
func (p *pipeline) passKnown() {
	for p.inflight.len() > 0 && p.inflight.oldest().delivery == nil {
		p.pass(p.inflight.pop())
	}
}

// pass records a row's outcome and hands a completed batch to phase 3. The
// hand-off waits while phase 3 is behind: the claim loop then makes no
// progress, which /healthz reports once it lasts longer than a lease.
func (p *pipeline) pass(e inflight) {
	e.batch.outcomes[e.index] = e.outcome
	if e.span != nil {
		endPublish(e.span, e.outcome)
	}
	if e.index == len(e.batch.claim.Rows)-1 {
		p.settle <- e.batch
	}
}

// waitOldest waits for the oldest confirm, its deadline, the hard stop, or
// wake, whichever comes first, and resolves the oldest unless wake came
// first. It reports whether it resolved one. With nothing in flight it only
// waits for wake.
func (p *pipeline) waitOldest(wake <-chan struct{}) bool {
	if p.inflight.len() == 0 {
		if b := p.d.broker; b != nil {
			b.Flush() // nothing is held while the claim loop waits
		}
		<-wake
		return false
	}
	oldest := p.inflight.oldest()
	timedOut := releaseConfirmTimeout
	select {
	case <-oldest.delivery.Done():
	default:
		// What the publishes left in the cork must leave before anything
		// waits for a confirm.
		oldest.sink.Flush()
		deadline := time.NewTimer(time.Until(oldest.publishedAt.Add(p.d.cfg.confirmTimeout())))
		defer deadline.Stop()
		select {
		case <-oldest.delivery.Done():
		case <-deadline.C:
		case <-p.hardStop:
			timedOut = releaseShutdown
		case <-wake:
			return false
		}
	}
	p.inflight.pop()
	p.confirms--
	p.bytes -= oldest.size
	p.d.metrics.InFlight.Set(float64(p.confirms))
	oldest.outcome = p.d.classify(oldest, timedOut)
	p.d.liveness.beat(0)
	p.pass(oldest)
	p.passKnown()
	return true
}

// waitFor resolves confirms until wake is closed.
func (p *pipeline) waitFor(wake <-chan struct{}) {
	for p.waitOldest(wake) {
	}
}

// sleep resolves confirms for d, or until ctx ends.
func (p *pipeline) sleep(ctx context.Context, d time.Duration) {
	p.d.liveness.beat(d)
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	p.waitFor(ctx.Done())
}

// idle resolves confirms for up to d, or until ctx ends or wake fires. It
// reports whether wake fired.
func (p *pipeline) idle(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	p.d.liveness.beat(d)
	ctx, cancel := context.WithTimeout(ctx, d)
	var woke atomic.Bool
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-wake:
			woke.Store(true)
			cancel()
		case <-ctx.Done():
		}
	}()
	p.waitFor(ctx.Done())
	cancel()
	// A wake-up taken after the timeout still counts: the claim that
	// follows comes after it, so no notification is lost.
	<-watched
	return woke.Load()
}

// makeRoom resolves confirms until a message of size bytes fits: fewer than
// depth confirms in flight, and their bytes within maxBytes. A message larger
// than maxBytes is published alone.
func (p *pipeline) makeRoom(depth int, maxBytes, size int64) {
	for p.confirms >= depth || (p.confirms > 0 && p.bytes+size > maxBytes) {
		p.waitOldest(nil)
	}
}

// drain resolves every confirm in flight.
func (p *pipeline) drain() {
	for p.inflight.len() > 0 {
		p.waitOldest(nil)
	}
}
