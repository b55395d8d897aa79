package drainer

import (
	"context"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("The commit guard", func() {
	start := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return start.Add(d) }

	It("is off without a ceiling, and times a settle every probe interval with one", func() {
		var none *commitGuard
		Expect(newCommitGuard(0)).To(BeNil())
		Expect(none.due(start)).To(BeFalse())
		none.settled(start, 500) // no panic

		g := newCommitGuard(5 * time.Millisecond)
		Expect(g.due(start)).To(BeTrue(), "the first settle is timed")
		g.observe(start, time.Millisecond)
		Expect(g.due(at(commitProbeInterval - time.Millisecond))).To(BeFalse())
		Expect(g.due(at(commitProbeInterval))).To(BeTrue())
	})

	It("starts at a hundred events a second and doubles the pace every two commits under half the ceiling", func() {
		g := newCommitGuard(5 * time.Millisecond)
		Expect(g.pace).To(Equal(startingPace))
		now := start
		fast := func(n int, commit time.Duration) {
			for range n {
				now = now.Add(commitProbeInterval)
				g.settled(now, 100)
				_, cut := g.observe(now, commit)
				Expect(cut).To(BeFalse(), "within the ceiling")
			}
		}
		fast(12, 2500*time.Microsecond)
		Expect(g.pace).To(BeNumerically("~", 6400, 1e-6), "past 5,000 events/s in 1.2 s")
		fast(5, 5*time.Millisecond)
		Expect(g.pace).To(BeNumerically("~", 6400, 1e-6), "a commit over half the ceiling, up to it, holds the pace")
	})

	It("halves what the drain did in the last second at a slow commit, holds, then climbs back in 3.2 s", func() {
		g := newCommitGuard(5 * time.Millisecond)
		// 800 rows every 100 ms for a second: 8,000 events/s.
		g.cut = start.Add(-time.Hour) // past its start
		g.pace = 20000
		for i := range 11 {
			g.settled(at(time.Duration(i)*commitProbeInterval), 800)
		}
		Expect(g.drainRate(at(time.Second))).To(Equal(8000.0), "the last second's rows, the one before it gone")
		now := at(time.Second)
		pace, cut := g.observe(now, 9*time.Millisecond)
		Expect(cut).To(BeTrue())
		Expect(pace).To(Equal(4000.0))

		pace, cut = g.observe(now.Add(commitGuardHold-time.Millisecond), 30*time.Millisecond)
		Expect(cut).To(BeFalse(), "the old pace's WAL is still being flushed")
		Expect(pace).To(Equal(4000.0), "nor does it climb while it waits")

		now = now.Add(commitGuardHold)
		for range recoverySteps {
			g.settled(now, 400)
			pace, _ = g.observe(now, time.Millisecond)
			now = now.Add(commitProbeInterval)
		}
		Expect(pace).To(Equal(8000.0), "32 fast commits, 3.2 s, climb back to where it was cut from, no longer doubling")
	})

	It("cuts from the drain's own rate when the pace was more than it reached, and never below its slowest pace", func() {
		g := newCommitGuard(5 * time.Millisecond)
		g.cut = start.Add(-time.Hour) // past its start
		// Far above what a shallow backlog lets it drain.
		g.pace = 100000
		g.settled(start, 30)
		g.settled(at(500*time.Millisecond), 30)
		now := at(time.Second)
		g.settled(now, 30)
		pace, cut := g.observe(now, 6*time.Millisecond)
		Expect(cut).To(BeTrue())
		Expect(pace).To(Equal(30.0), "half of the 60 rows of the last second, the 30 of a second ago out of it")

		for range 20 {
			now = now.Add(commitGuardHold)
			g.settled(now, 1)
			pace, _ = g.observe(now, time.Second)
		}
		Expect(pace).To(Equal(minGuardedPace), "halved at each slow commit, but never below the slowest pace, where a claim of a row and its timed settle still go on")
	})

	It("does not raise a pace the drain is not using, so a burst after a quiet spell starts near the drain's own rate", func() {
		g := newCommitGuard(5 * time.Millisecond)
		g.cut = start.Add(-time.Hour) // past its start
		g.pace, g.recovery = 4000, 125
		now := start
		for range 50 {
			now = now.Add(commitProbeInterval)
			g.settled(now, 30) // 300 events/s: a shallow backlog
			g.observe(now, time.Millisecond)
		}
		Expect(g.pace).To(Equal(4000.0), "at 300 events/s a pace of 2,400 already leaves room enough")
		g.pace = 2000
		for range 10 {
			now = now.Add(commitProbeInterval)
			g.settled(now, 30)
			g.observe(now, time.Millisecond)
		}
		Expect(g.pace).To(Equal(2500.0), "raised until past eight times the drain's rate, 2,400, and no further")
		g.settles = nil
		now = now.Add(time.Minute)
		g.settled(now, 500) // the first claim's worth after an idle minute
		g.observe(now, time.Millisecond)
		Expect(g.pace).To(Equal(2625.0), "500 rows in their first probe interval: 5,000 events/s, and the pace climbs again")
	})

	// guarded starts a drainer with ceiling as --max-commit-latency on a
	// backlog of 20,000 rows.
	guarded := func(ctx context.Context, ceiling time.Duration) (*running, outbox.TableSpec) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		db.Seed(ctx, spec.Name, 20000)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.MaxCommitLatency = ceiling
		return startDrainer(ctx, cfg), spec
	}

	It("slows a drain to its slowest pace while every commit is slower than the ceiling", Label(tier.DB, tier.Broker), func(ctx SpecContext) {
		// No commit, synchronous or not, returns within a nanosecond.
		d, spec := guarded(ctx, time.Nanosecond)
		pace := func() float64 { return testutil.ToFloat64(d.metrics.CommitPace) }
		Eventually(pace, drainTimeout, 20*time.Millisecond).Should(Equal(minGuardedPace))
		cuts := func() float64 { return testutil.ToFloat64(d.metrics.CommitPaceCuts) }
		atSlowest := cuts()
		Expect(atSlowest).To(BeNumerically(">=", 1), "the halvings to the slowest pace are counted")
		Expect(float64(d.rate.limiter.Limit())).To(Equal(minGuardedPace), "the claims are held to the pace")
		Eventually(d.logs).Should(gbytes.Say(`Commits take longer than --max-commit-latency even at the slowest pace`))

		// The rows claimed at a faster pace are published first.
		published := func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }
		Eventually(published, drainTimeout).Should(BeNumerically(">=", int(testutil.ToFloat64(d.metrics.Claimed))))
		from, began := published(), time.Now()
		time.Sleep(3 * time.Second)
		rate := float64(published()-from) / time.Since(began).Seconds()
		GinkgoWriter.Printf("at the slowest pace: %.1f events/s; %d of 20,000 published\n", rate, published())
		// A second of the pace may go at once, and the pace itself: 10/s.
		Expect(rate).To(BeNumerically("<=", 2*minGuardedPace+5))
		Expect(rate).To(BeNumerically(">", 0), "it still drains, and times its settles")
		Expect(histogramCount(d.reg, "spillway_drainer_commit_duration_seconds")).To(BeNumerically(">", 10))
		Expect(db.Count(ctx, spec.Name, "published_at IS NULL")).To(BeNumerically(">", 10000), "the backlog waits")
		Eventually(cuts, drainTimeout).Should(BeNumerically(">", atSlowest), "so are the holds at it, each slow commit after the last cut's hold")
		Expect(strings.Count(string(d.logs.Contents()), "even at the slowest pace")).To(Equal(1),
			"logged on reaching it, not at each of the cuts that keep it there")
	})

	It("drains at full speed while commits stay within the ceiling, timing them all along", Label(tier.DB, tier.Broker), func(ctx SpecContext) {
		d, spec := guarded(ctx, time.Minute)
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		// Three doublings ask for 100 events/s of drain, which any machine
		// gives; the last settle's pace reaches the limiter, then the gauge.
		Eventually(func(g Gomega) {
			pace := testutil.ToFloat64(d.metrics.CommitPace)
			g.Expect(pace).To(BeNumerically(">=", 8*startingPace), "doubled every two timed commits, never cut")
			g.Expect(float64(d.rate.limiter.Limit())).To(Equal(pace), "the claims go at the pace")
		}, 5*time.Second, 20*time.Millisecond).Should(Succeed())
		Expect(histogramCount(d.reg, "spillway_drainer_commit_duration_seconds")).To(BeNumerically(">", 0))
		Expect(testutil.ToFloat64(d.metrics.CommitPaceCuts)).To(BeZero(), "no commit took a minute")
	})
})
