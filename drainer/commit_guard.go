package drainer

import (
	"math"
	"time"
)

// commitGuard is --max-commit-latency: it paces the drain by how long a
// commit on the database takes while it runs. An application's commit waits
// for the WAL to be flushed up to its commit record, the drain's WAL before
// it included, so that wait grows with the drain's pace; a --max-rate that
// keeps it low must be chosen for each disk, and a database under load from
// elsewhere has less room than the cap assumed. The guard finds the pace
// as TCP's congestion control finds a link's rate: every
// commitProbeInterval one settle commits synchronously and is timed. The
// pace starts low and doubles every two commits under half the ceiling
// (a backlog is often drained just after a checkpoint, when every page it
// touches is logged whole, and a drain at full speed from its first second
// took the application's commits up with it); a commit slower than the
// ceiling halves it; from then on, each commit under half the ceiling
// raises it a step, and one between half and the whole holds it. A pace
// the drain does not use, eight times what it settled in the last second,
// is not raised.
//
// Ten commits a second show how long a commit usually takes, not the
// application's tail: in make bench, with the ceiling at the application's
// p99 alone, its p99 beside the guarded drain was 1.4–2.4 × that, at 188–
// 3,132 events/s, against 3.4–4.9 × uncapped (see docs/benchmark.md). Used by the
// settle goroutine only; the pace reaches the claims through the rate cap's
// limiter.
type commitGuard struct {
	ceiling time.Duration
	// pace is the events per second the guard allows. Until the first slow
	// commit (cut is zero) it grows by startGrowth at each fast one; after,
	// a cut halves it and each fast commit adds recovery, so that
	// recoverySteps of them take it back to where the cut came from.
	pace     float64
	recovery float64
	cut      time.Time
	probed   time.Time
	// settles are the rows settled within the last rateWindow, since the
	// drain began settling, for the drain's own pace.
	settles []settledRows
	since   time.Time
}

type settledRows struct {
	at   time.Time
	rows int
}

const (
	// commitProbeInterval is how often a settle is timed: ten synchronous
	// commits a second add no flush an application would notice.
	commitProbeInterval = 100 * time.Millisecond
	// commitGuardHold is how long after a cut the guard waits before judging
	// the pace again: the commits of the old pace's WAL are still being
	// flushed, and judging them would cut again for the same excess.
	commitGuardHold = 3 * commitProbeInterval
	// minGuardedPace keeps a claim of a row going every claimPace, and with
	// it the timed settles that tell when the database has room again.
	minGuardedPace = 10.0
	// startingPace is where the doubling starts, and startGrowth its step
	// at each fast commit: it doubles every 200 ms, past 5,000 events/s in
	// 1.2 s. A commit slower than the ceiling shows a pace 300 ms after the
	// drain took it up (commitGuardHold), so a faster doubling overshot
	// further before its first cut.
	startingPace = 10 * minGuardedPace
	startGrowth  = math.Sqrt2
	// recoverySteps is how many fast commits take the pace back up to where
	// a cut came from: 3.2 s.
	recoverySteps = 32
	// rateWindow is the span over which the drain's own pace is read.
	rateWindow = time.Second
)

// newCommitGuard returns the guard, or nil for none.
func newCommitGuard(ceiling time.Duration) *commitGuard {
	if ceiling <= 0 {
		return nil
	}
	return &commitGuard{ceiling: ceiling, pace: startingPace}
}

// allowed is the pace, +Inf without a guard.
func (g *commitGuard) allowed() float64 {
	if g == nil {
		return math.Inf(1)
	}
	return g.pace
}

// due says whether the next settle should be timed.
func (g *commitGuard) due(now time.Time) bool {
	return g != nil && now.Sub(g.probed) >= commitProbeInterval
}

// settled counts the rows one settle changed.
func (g *commitGuard) settled(now time.Time, rows int) {
	if g == nil || rows == 0 {
		return
	}
	g.forget(now)
	if len(g.settles) == 0 {
		g.since = now
	}
	g.settles = append(g.settles, settledRows{at: now, rows: rows})
}

// forget drops the settles older than the rateWindow.
func (g *commitGuard) forget(now time.Time) {
	old := 0
	for old < len(g.settles) && now.Sub(g.settles[old].at) >= rateWindow {
		old++
	}
	g.settles = g.settles[old:]
}

// drainRate is the rows settled per second over the rateWindow up to now,
// or, when the drain began settling more recently, since a probe interval
// before its first settle, whose rows were claimed and published then.
func (g *commitGuard) drainRate(now time.Time) float64 {
	g.forget(now)
	if len(g.settles) == 0 {
		return 0
	}
	rows := 0
	for _, s := range g.settles {
		rows += s.rows
	}
	return float64(rows) / min(rateWindow, now.Sub(g.since)+commitProbeInterval).Seconds()
}

// observe takes one timed commit and returns the pace, and whether this
// commit cut it.
func (g *commitGuard) observe(now time.Time, commit time.Duration) (pace float64, cut bool) {
	g.probed = now
	if now.Sub(g.cut) < commitGuardHold {
		return g.pace, false
	}
	switch {
	case commit > g.ceiling:
		// Cut from what the drain really did: a pace it could not reach,
		// because the broker or a shallow backlog held it back, says
		// nothing of the WAL it wrote.
		from := math.Min(g.pace, g.drainRate(now))
		g.pace = math.Max(minGuardedPace, from/2)
		g.recovery = math.Max(1, from/2/recoverySteps)
		g.cut = now
		return g.pace, true
	case 2*commit > g.ceiling:
		// Within the ceiling but not by much: the pace holds.
	case g.drainRate(now) < g.pace/8:
		// The broker or a shallow backlog holds the drain back, not the
		// pace: raising it would only leave room for a burst.
	case g.cut.IsZero():
		g.pace *= startGrowth
	default:
		g.pace += g.recovery
	}
	return g.pace, false
}
