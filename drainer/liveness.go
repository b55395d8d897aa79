package drainer

import (
	"sync/atomic"
	"time"
)

// liveness is when the claim loop must next show progress. Every step of the
// loop that may block says how long it may wait, and each step is otherwise
// bounded by the lease (a claim, a confirm, a publish). A loop that overruns
// its last promise by more than a lease is stuck, and a restart is the cure:
// its claims expire, and its rows go to the other drainers.
type liveness struct {
	lease    time.Duration
	due      atomic.Int64 // unix nanoseconds
	stopping atomic.Bool
}

// beat records progress; the next step may wait for wait. It never moves
// the promise earlier: progress made inside a longer wait (a confirm
// resolved while idling) leaves that wait's promise standing.
func (l *liveness) beat(wait time.Duration) {
	due := time.Now().Add(wait + l.lease).UnixNano()
	for {
		old := l.due.Load()
		if due <= old || l.due.CompareAndSwap(old, due) {
			return
		}
	}
}

// overdue is by how much the claim loop has overrun its promise at now.
func (l *liveness) overdue(now time.Time) time.Duration {
	if l.stopping.Load() {
		return 0
	}
	return now.Sub(time.Unix(0, l.due.Load()))
}
