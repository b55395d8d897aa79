package drainer

import (
	"context"
	"time"

	"golang.org/x/time/rate"
)

// rateCap is --max-rate: the events per second that all the drainers of one
// table publish together, at most, so that a backlog drains at a pace the
// application's own commits can live beside. Each drainer takes an equal
// share among the drainers it finds holding claims on the table, counted
// from the leases every shareInterval: the cap holds as a fleet scales, with
// no restart and no coordination but the outbox itself. A drainer that is
// idle holds no claim, and leaves its share to the others.
type rateCap struct {
	total   float64
	limiter *rate.Limiter
	// counted is when the share was last set; claim goroutine only.
	counted time.Time
}

// shareInterval is how often a drainer counts the others.
const shareInterval = time.Second

// newRateCap returns the cap, or nil for none. burst is the largest claim.
func newRateCap(total float64, burst int) *rateCap {
	if total <= 0 {
		return nil
	}
	return &rateCap{total: total, limiter: rate.NewLimiter(rate.Limit(total), burst)}
}

// refresh sets this drainer's share once a shareInterval, from the number
// of other drainers holding claims. Until the count succeeds the share
// stays as it was: the whole cap at first, which one drainer alone may use.
func (r *rateCap) refresh(ctx context.Context, others func(context.Context) (int, error)) {
	if r == nil || time.Since(r.counted) < shareInterval {
		return
	}
	n, err := others(ctx)
	if err != nil {
		return
	}
	r.counted = time.Now()
	r.limiter.SetLimit(rate.Limit(r.total / float64(n+1)))
}

// claimSize is how many rows the next claim may take: a second's worth of
// this drainer's share, and a third of a lease's at most, so that the wait
// before publishing them never eats into the lease; between 1 and batch.
func (r *rateCap) claimSize(batch int, lease time.Duration) int {
	if r == nil {
		return batch
	}
	pace := min(time.Second, lease/3)
	return max(1, min(batch, int(float64(r.limiter.Limit())*pace.Seconds())))
}

// take counts n rows claimed against the share, and returns how long to wait
// before publishing them.
func (r *rateCap) take(n int) time.Duration {
	if r == nil || n == 0 {
		return 0
	}
	return r.limiter.ReserveN(time.Now(), min(n, r.limiter.Burst())).Delay()
}
