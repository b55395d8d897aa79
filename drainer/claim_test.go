package drainer

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("The claim", Label(tier.DB, tier.Broker), func() {
	It("releases the rows of a claim whose result was lost, and keeps the claims in phases 2 and 3", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 10)
		d := newDrainer(ctx, testConfig("drainer-a", spec, "amq.topic"))
		p := d.cfg.ClaimParams()
		p.BatchSize = 6
		inFlight, err := d.store.Claim(ctx, p)
		Expect(err).NotTo(HaveOccurred())
		Expect(inFlight.Rows).To(HaveLen(6))
		d.held.add(inFlight.Token)
		// A claim that committed, its result lost on the way back.
		lost := d.store.Table().Claim(d.cfg.ClaimParams())
		Expect(db.Exec(ctx, lost.SQL, lost.Args...)).To(Equal(int64(4)))

		d.releaseUnread(ctx)
		Expect(db.Count(ctx, spec.Name, "claimed_by IS NULL")).To(Equal(4), "the lost claim's rows are released")
		Expect(db.Count(ctx, spec.Name, "claimed_by = 'drainer-a' AND claimed_at = $1", inFlight.Token)).To(Equal(6),
			"the rows of the claim in flight are still held")
	})
})
