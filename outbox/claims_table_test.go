package outbox_test

import (
	"context"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/tier"
)

// claimsStore opens a store of table whose leases are kept in its claims
// table, dropped with the spec.
func claimsStore(ctx context.Context, spec outbox.TableSpec) *outbox.Store {
	store, err := outbox.OpenStore(ctx, pool, spec)
	Expect(err).NotTo(HaveOccurred())
	Expect(store.KeepLeasesInClaimsTable(ctx)).To(Succeed())
	db.DropAfterTest(spec.Name + "_claims")
	return store
}

func claimIDs(c outbox.Claimed) []string {
	ids := make([]string, len(c.Rows))
	for i, r := range c.Rows {
		ids[i] = r.ID
	}
	return ids
}

var deleting = outbox.FailurePolicy{InitialMillis: 1000, MaxMillis: 60_000, MaxAttempts: 10}

var _ = Describe("Leases kept in a claims table (make bench's design)", Label(tier.DB), func() {
	It("keeps a claim's rows from every other claim while writing nothing into them, and settles them by deleting them and the claim", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 10)
		store := claimsStore(ctx, spec)

		a, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 4))
		Expect(err).NotTo(HaveOccurred())
		Expect(a.Rows).To(HaveLen(4))
		Expect(a.Due).To(Equal(4))
		Expect(db.Count(ctx, spec.Name, "claimed_at IS NULL AND claimed_by IS NULL")).To(Equal(10), "nothing written into the rows")
		Expect(db.Count(ctx, spec.Name+"_claims", "drainer = 'drainer-a' AND cardinality(ids) = 4")).To(Equal(1))

		b, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 100))
		Expect(err).NotTo(HaveOccurred())
		Expect(b.Rows).To(HaveLen(6), "only the rows no claim holds")
		Expect(slices.ContainsFunc(claimIDs(b), func(id string) bool { return slices.Contains(claimIDs(a), id) })).To(BeFalse())
		Expect(b.Rows[0].Payload).NotTo(BeEmpty())

		done, err := store.Settle(ctx, "drainer-a", outbox.Settlement{Published: a.Leases(), DeletePublished: true}, deleting)
		Expect(err).NotTo(HaveOccurred())
		Expect(done.Published).To(Equal(int64(4)))
		Expect(db.Count(ctx, spec.Name, "true")).To(Equal(6))
		Expect(db.Count(ctx, spec.Name+"_claims", "true")).To(Equal(1), "drainer-b's claim is left")
	})

	It("fences the settle of a claim that another claim took over once its lease was past", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 3)
		store := claimsStore(ctx, spec)
		a, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(a.Rows).To(HaveLen(3))
		// Back-date drainer-a's claim past the lease.
		db.Exec(ctx, "UPDATE "+spec.Name+"_claims SET claimed_at = claimed_at - interval '1 hour'")

		b, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(claimIDs(b)).To(ConsistOf(claimIDs(a)), "the expired claim's rows are taken over")
		Expect(db.Count(ctx, spec.Name+"_claims", "drainer = 'drainer-a'")).To(Equal(0), "the expired claim is deleted")

		late, err := store.Settle(ctx, "drainer-a", outbox.Settlement{Published: a.Leases(), DeletePublished: true}, deleting)
		Expect(err).NotTo(HaveOccurred())
		Expect(late.Published).To(BeZero(), "the late settle is fenced")
		Expect(db.Count(ctx, spec.Name, "true")).To(Equal(3))

		failed := outbox.Settlement{Failed: b.Leases()[:1], Failures: []outbox.Failure{{Reason: "nacked"}}, Published: b.Leases()[1:], DeletePublished: true}
		done, err := store.Settle(ctx, "drainer-b", failed, deleting)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(Equal(outbox.Settled{Published: 2, Failed: 1}))
		Expect(db.Count(ctx, spec.Name, "attempts = 1 AND last_error = 'nacked' AND available_at > now()")).To(Equal(1))
		Expect(db.Count(ctx, spec.Name+"_claims", "true")).To(Equal(0))
	})

	It("frees a drainer's claims at release but those it keeps", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 4)
		store := claimsStore(ctx, spec)
		for range 2 {
			_, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 2))
			Expect(err).NotTo(HaveOccurred())
		}
		_, err := store.ReleaseHeld(ctx, "drainer-a", 0, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(db.Count(ctx, spec.Name+"_claims", "true")).To(Equal(0))

		kept, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 2))
		Expect(err).NotTo(HaveOccurred())
		_, err = store.Claim(ctx, suite.ClaimParams("drainer-a", 2))
		Expect(err).NotTo(HaveOccurred())
		_, err = store.ReleaseHeld(ctx, "drainer-a", 0, []time.Time{kept.Token})
		Expect(err).NotTo(HaveOccurred())
		Expect(db.Count(ctx, spec.Name+"_claims", "true")).To(Equal(1))
		again, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(again.Rows).To(HaveLen(2), "the released claim's rows, not the kept one's")
	})

	It("refuses an ordered table, whose leases are in the due time", func(ctx SpecContext) {
		store, err := outbox.OpenStore(ctx, pool, db.OrderedOutbox(ctx, "block"))
		Expect(err).NotTo(HaveOccurred())
		Expect(store.KeepLeasesInClaimsTable(ctx)).To(MatchError(ContainSubstring("ordered table")))
	})
})
