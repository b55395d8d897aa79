package drainer

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/time/rate"
)

var _ = Describe("The rate cap", func() {
	It("claims a tenth of a second's worth of the share, within a third of the shortest lease, and at least one row", func() {
		var none *rateCap
		Expect(none.claimSize(500)).To(Equal(500), "no cap: the batch")
		Expect(none.take(500)).To(BeZero())
		r := newRateCap(16000, 500)
		Expect(r.claimSize(500)).To(Equal(500), "the batch at most")
		r.limiter.SetLimit(rate.Limit(400))
		Expect(r.claimSize(500)).To(Equal(40), "a tenth of a second's worth, not a second's burst")
		Expect(claimPace).To(BeNumerically("<=", MinLeaseTTL(1)/3), "the wait before publishing is within a third of any valid lease")
		r.limiter.SetLimit(rate.Limit(0.5))
		Expect(r.claimSize(500)).To(Equal(1))
	})

	It("makes every claim, a new drainer's first too, wait for its rows' share of the cap", func() {
		r := newRateCap(100, 500)
		// Each wait is its rows' share less the time since the cap was
		// made: exact from above, and a busy machine only shortens it.
		Expect(r.take(50)).To(And(BeNumerically("<=", 500*time.Millisecond), BeNumerically(">", 400*time.Millisecond)), "no burst to start with")
		Expect(r.take(50)).To(And(BeNumerically("<=", time.Second), BeNumerically(">", 900*time.Millisecond)))
	})

	It("lets an idle drainer publish at most a second of its share ahead of pace", func() {
		r := newRateCap(100, 500)
		Expect(r.limiter.Burst()).To(Equal(100), "a second of the cap, not a batch")
		r.setShare(10)
		Expect(r.limiter.Burst()).To(Equal(10), "a second of the share")
		r.setShare(0.5)
		Expect(r.limiter.Burst()).To(Equal(1))
	})

	It("shares the cap among the drainers holding claims, counted once a second", func(ctx SpecContext) {
		r := newRateCap(900, 100)
		counted := 0
		r.refresh(ctx, func(context.Context) (int, error) { counted++; return 2, nil })
		Expect(float64(r.limiter.Limit())).To(Equal(300.0))
		Expect(r.limiter.Burst()).To(Equal(100), "a second of the share, within the batch")
		r.refresh(ctx, func(context.Context) (int, error) { counted++; return 0, nil })
		Expect(counted).To(Equal(1), "not again within a second")
		Expect(float64(r.limiter.Limit())).To(Equal(300.0))
	})

	It("holds two drainers of one table to --max-rate together, each publishing its share", Label("integration"), func(ctx SpecContext) {
		spec := canonicalOutbox(ctx)
		topo := topology("#", nil)
		seed(ctx, spec.Name, 8000)
		const capped = 400.0
		for _, id := range []string{"drainer-a", "drainer-b"} {
			cfg := testConfig(id, spec, topo.Exchange)
			cfg.MaxRate = capped
			startDrainer(ctx, cfg)
		}
		published := func() int { return count(ctx, spec.Name, "published_at IS NOT NULL") }
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
			by[id] = count(ctx, spec.Name, "published_at IS NOT NULL AND claimed_by = $1", id)
			Expect(by[id]).To(BeNumerically(">", 0), "each published its share: %v", by)
		}
	})
})
