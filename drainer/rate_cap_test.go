package drainer

import (
	"context"
	"errors"
	"math"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("The rate cap", func() {
	It("claims a tenth of a second's worth of the share, within a third of the shortest lease, and at least one row", func() {
		var none *rateCap
		Expect(none.claimSize(500)).To(Equal(500), "no cap: the batch")
		Expect(none.take(500)).To(BeZero())
		r := newRateCap(16000, 500, math.Inf(1))
		Expect(r.claimSize(500)).To(Equal(500), "the batch at most")
		r.limiter.SetLimit(rate.Limit(400))
		Expect(r.claimSize(500)).To(Equal(40), "a tenth of a second's worth, not a second's burst")
		Expect(claimPace).To(BeNumerically("<=", MinLeaseTTL(1)/3), "the wait before publishing is within a third of any valid lease")
		r.limiter.SetLimit(rate.Limit(0.5))
		Expect(r.claimSize(500)).To(Equal(1))
	})

	It("makes every claim, a new drainer's first too, wait for its rows' share of the cap", func() {
		r := newRateCap(100, 500, math.Inf(1))
		// Each wait is its rows' share less the time since the cap was
		// made: exact from above, and a busy machine only shortens it.
		Expect(r.take(50)).To(And(BeNumerically("<=", 500*time.Millisecond), BeNumerically(">", 400*time.Millisecond)), "no burst to start with")
		Expect(r.take(50)).To(And(BeNumerically("<=", time.Second), BeNumerically(">", 900*time.Millisecond)))
	})

	It("lets an idle drainer publish at most a second of its share ahead of pace", func() {
		r := newRateCap(100, 500, math.Inf(1))
		Expect(r.limiter.Burst()).To(Equal(100), "a second of the cap, not a batch")
		r.setShare(10)
		Expect(r.limiter.Burst()).To(Equal(10), "a second of the share")
		r.setShare(0.5)
		Expect(r.limiter.Burst()).To(Equal(1))
	})

	It("shares the cap among the drainers running, counted once a second", func(ctx SpecContext) {
		r := newRateCap(900, 100, math.Inf(1))
		counted := 0
		start := time.Now()
		count := func(after time.Duration, others int, err error) error {
			return r.refresh(ctx, start.Add(after), func(context.Context) (int, error) { counted++; return others, err })
		}
		Expect(count(0, 2, nil)).To(Succeed())
		Expect(float64(r.limiter.Limit())).To(Equal(300.0))
		Expect(r.limiter.Burst()).To(Equal(100), "a second of the share, within the batch")
		Expect(count(900*time.Millisecond, 0, nil)).To(Succeed())
		Expect(counted).To(Equal(1), "not again within a second")
		Expect(float64(r.limiter.Limit())).To(Equal(300.0))
		Expect(count(time.Second, 0, errors.New("connection refused"))).To(MatchError("connection refused"))
		Expect(float64(r.limiter.Limit())).To(Equal(300.0), "a failed count keeps the share")
		Expect(count(1500*time.Millisecond, 0, nil)).To(Succeed())
		Expect(counted).To(Equal(2), "and is tried again a second later, not at the next claim")
		Expect(count(2*time.Second, 0, nil)).To(Succeed())
		Expect(float64(r.limiter.Limit())).To(Equal(900.0), "alone, the whole cap")
	})

	It("holds two drainers of one table to --max-rate together, each publishing its share", Label(tier.DB, tier.Broker), func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		db.Seed(ctx, spec.Name, 8000)
		const capped = 400.0
		for _, id := range []string{"drainer-a", "drainer-b"} {
			cfg := testConfig(id, spec, topo.Exchange)
			cfg.MaxRate = capped
			startDrainer(ctx, cfg)
		}
		published := func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }
		// Past each drainer's first burst and first seconds, before it has
		// counted the other, while it takes the whole cap, and the wait
		// that pays that back.
		Eventually(published, drainTimeout).Should(BeNumerically(">=", 3000))
		from, start := published(), time.Now()
		Eventually(published, drainTimeout).Should(BeNumerically(">=", from+2000))
		rate := float64(published()-from) / time.Since(start).Seconds()
		GinkgoWriter.Printf("two drainers capped at %.0f/s together published %.0f/s\n", capped, rate)
		Expect(rate).To(BeNumerically("<=", 1.25*capped), "the cap holds for the two together")
		Expect(rate).To(BeNumerically(">=", 0.5*capped), "and lets them drain")
		by := map[string]int{}
		for _, id := range []string{"drainer-a", "drainer-b"} {
			by[id] = db.Count(ctx, spec.Name, "published_at IS NOT NULL AND claimed_by = $1", id)
			Expect(by[id]).To(BeNumerically(">", 0), "each published its share: %v", by)
		}
	})

	It("keeps each drainer to half the cap while both keep up with the commits, between claims as much as in them", Label(tier.DB, tier.Broker), func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		_, err := outbox.InstallNotifyTrigger(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		topo := topology("#", nil)
		const capped, commits = 150.0, 100
		// Below the cap, each drainer claims a row or two at each commit's
		// notification and holds no claim most of the time. Counted by the
		// claims they held, each missed the other, and took the whole cap
		// that a burst of commits would then have drained at.
		traffic := testenv.StartTraffic(testenv.Outbox{DB: pool, Table: spec.Name}, commits)
		defer func() {
			_, err := traffic.Stop()
			Expect(err).NotTo(HaveOccurred())
		}()
		var drainers []*running
		for _, id := range []string{"drainer-a", "drainer-b"} {
			cfg := testConfig(id, spec, topo.Exchange)
			cfg.MaxRate = capped
			cfg.PollInterval = DefaultConfig().PollInterval
			drainers = append(drainers, startDrainer(ctx, cfg))
		}
		halves := func(g Gomega) {
			for _, d := range drainers {
				g.Expect(float64(d.rate.limiter.Limit())).To(Equal(capped/2), "%s's share", d.cfg.DrainerID)
			}
		}
		// Once each has counted the other, after its first second.
		Eventually(halves, drainTimeout, 20*time.Millisecond).Should(Succeed())
		Consistently(halves, 8*time.Second, 20*time.Millisecond).Should(Succeed())
		for _, d := range drainers {
			Expect(testutil.ToFloat64(d.metrics.RateShare)).To(Equal(capped/2), "%s's spillway_drainer_rate_share_events_per_second", d.cfg.DrainerID)
		}
		Expect(db.Count(ctx, spec.Name, "published_at IS NULL AND enqueued_at < now() - interval '1 second'")).To(BeZero(), "they kept up")

		// A drainer that stops leaves the roster with its session, and the
		// other takes the whole cap at its next count.
		drainers[0].stop()
		Eventually(drainers[0].exited, 30*time.Second).Should(BeClosed())
		Eventually(func() float64 { return float64(drainers[1].rate.limiter.Limit()) }, 5*time.Second, 20*time.Millisecond).Should(Equal(capped))
	})
})
