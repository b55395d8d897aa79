package drainer

import (
	"context"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// rateCap is --max-rate: the events per second that all the drainers of one
// table publish together, at most, so that a backlog drains at a pace the
// application's own commits can live beside. Each drainer takes an equal
// share among the drainers running on the table, counted every
// shareInterval from a lock that each holds in shared mode (Roster): the
// cap holds as a fleet scales, with no restart and no coordination but the
// database itself.
//
// Counting the drainers that held claims instead missed the ones keeping up
// with a shallow backlog, which hold claims only between a claim and its
// settle; the others then took the whole cap, and a fleet of two capped at
// 150 events/s published 164-196 a second under 300 events/s of commits.
//
// It also holds the drainer to the pace of its commit guard
// (--max-commit-latency), with or without a cap.
type rateCap struct {
	// total is --max-rate, +Inf without a cap.
	total   float64
	batch   int
	limiter *rate.Limiter
	// counted is when the share was last set; claim goroutine only.
	counted time.Time
	// share is this drainer's part of total, pace the commit guard's; the
	// limiter runs at the lower. The claim goroutine sets the share, the
	// settle goroutine the pace.
	mu          sync.Mutex
	share, pace float64
}

// shareInterval is how often a drainer counts the others.
const shareInterval = time.Second

// newRateCap returns the cap, or nil for none (no --max-rate, and pace
// +Inf: no commit guard); batch is the largest claim, pace the guard's
// starting pace. The bucket starts empty and holds a second of the share: a
// drainer that starts, or comes back from an idle spell, publishes at the
// cap's pace and never a batch ahead of it. With a full bucket of a batch,
// an 8 s run capped at 187 events/s published 233 a second.
func newRateCap(total float64, batch int, pace float64) *rateCap {
	if total <= 0 && math.IsInf(pace, 1) {
		return nil
	}
	r := &rateCap{total: math.Inf(1), batch: batch, share: math.Inf(1), pace: pace}
	if total > 0 {
		r.total, r.share = total, total
	}
	perSecond := math.Min(r.share, r.pace)
	r.limiter = rate.NewLimiter(limitOf(perSecond), r.burst(perSecond))
	r.limiter.ReserveN(time.Now(), r.limiter.Burst())
	return r
}

// limitOf is perSecond as the limiter's limit.
func limitOf(perSecond float64) rate.Limit {
	if math.IsInf(perSecond, 1) {
		return rate.Inf
	}
	return rate.Limit(perSecond)
}

// burst is a second of a share, within a claim: the most a drainer may
// publish ahead of pace.
func (r *rateCap) burst(perSecond float64) int {
	return max(1, int(math.Min(float64(r.batch), math.Ceil(perSecond))))
}

// capShare is this drainer's share of --max-rate, 0 without a cap.
func (r *rateCap) capShare() float64 {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if math.IsInf(r.share, 1) {
		return 0
	}
	return r.share
}

// setShare sets this drainer's share of --max-rate, in events per second.
func (r *rateCap) setShare(perSecond float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.share = perSecond
	r.apply()
}

// setPace sets the commit guard's pace, in events per second.
func (r *rateCap) setPace(perSecond float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pace = perSecond
	r.apply()
}

// apply runs the limiter at the lower of the share and the pace; r.mu held.
func (r *rateCap) apply() {
	perSecond := math.Min(r.share, r.pace)
	r.limiter.SetLimit(limitOf(perSecond))
	r.limiter.SetBurst(r.burst(perSecond))
}

// refresh sets this drainer's share once a shareInterval, from the number
// of other drainers running. A failed count keeps the share as it was (the
// whole cap at first, which one drainer alone may use), and is tried again
// a shareInterval later, not at every claim.
func (r *rateCap) refresh(ctx context.Context, now time.Time, others func(context.Context) (int, error)) error {
	if r == nil || math.IsInf(r.total, 1) || now.Sub(r.counted) < shareInterval {
		return nil
	}
	r.counted = now
	n, err := others(ctx)
	if err != nil {
		return err
	}
	r.setShare(r.total / float64(n+1))
	return nil
}

// claimPace is the share of time one capped claim takes rows for. A capped
// drain is for the application's sake, and its commits wait behind bursts:
// claimed a second's worth at a time, each second's rows were claimed,
// published and marked in one burst of row versions and WAL, and the
// application's commit p99 beside a drain capped at the naive drainer's rate
// was 1.45 × that beside the naive drainer, which publishes a row at a time.
// It is within a third of the shortest lease the lease rule allows (300 ms),
// so the wait before publishing a claim never eats into its lease.
const claimPace = 100 * time.Millisecond

// claimSize is how many rows the next claim may take: claimPace's worth of
// this drainer's share, between 1 and batch.
func (r *rateCap) claimSize(batch int) int {
	if r == nil {
		return batch
	}
	return max(1, int(math.Min(float64(batch), float64(r.limiter.Limit())*claimPace.Seconds())))
}

// take counts n rows claimed against the share, and returns how long to wait
// before publishing them.
func (r *rateCap) take(n int) time.Duration {
	if r == nil || n == 0 {
		return 0
	}
	return r.limiter.ReserveN(time.Now(), min(n, r.limiter.Burst())).Delay()
}
