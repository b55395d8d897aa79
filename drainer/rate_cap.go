package drainer

import (
	"context"
	"math"
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
type rateCap struct {
	total   float64
	batch   int
	limiter *rate.Limiter
	// counted is when the share was last set; claim goroutine only.
	counted time.Time
}

// shareInterval is how often a drainer counts the others.
const shareInterval = time.Second

// newRateCap returns the cap, or nil for none; batch is the largest claim.
// The bucket starts empty and holds a second of the share: a drainer that
// starts, or comes back from an idle spell, publishes at the cap's pace and
// never a batch ahead of it. With a full bucket of a batch, an 8 s run
// capped at 187 events/s published 233 a second.
func newRateCap(total float64, batch int) *rateCap {
	if total <= 0 {
		return nil
	}
	r := &rateCap{total: total, batch: batch}
	r.limiter = rate.NewLimiter(rate.Limit(total), r.burst(total))
	r.limiter.ReserveN(time.Now(), r.limiter.Burst())
	return r
}

// burst is a second of a share, within a claim: the most a drainer may
// publish ahead of pace.
func (r *rateCap) burst(perSecond float64) int {
	return max(1, min(r.batch, int(math.Ceil(perSecond))))
}

// share is this drainer's events per second, 0 without a cap.
func (r *rateCap) share() float64 {
	if r == nil {
		return 0
	}
	return float64(r.limiter.Limit())
}

// setShare sets this drainer's events per second.
func (r *rateCap) setShare(perSecond float64) {
	r.limiter.SetLimit(rate.Limit(perSecond))
	r.limiter.SetBurst(r.burst(perSecond))
}

// refresh sets this drainer's share once a shareInterval, from the number
// of other drainers running. A failed count keeps the share as it was (the
// whole cap at first, which one drainer alone may use), and is tried again
// a shareInterval later, not at every claim.
func (r *rateCap) refresh(ctx context.Context, now time.Time, others func(context.Context) (int, error)) error {
	if r == nil || now.Sub(r.counted) < shareInterval {
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
	return max(1, min(batch, int(float64(r.limiter.Limit())*claimPace.Seconds())))
}

// take counts n rows claimed against the share, and returns how long to wait
// before publishing them.
func (r *rateCap) take(n int) time.Duration {
	if r == nil || n == 0 {
		return 0
	}
	return r.limiter.ReserveN(time.Now(), min(n, r.limiter.Burst())).Delay()
}
