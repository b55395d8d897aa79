package outbox_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("Settling", Label(tier.DB), func() {
	DescribeTable("is fenced on the claim itself: an older batch's failure does not touch the row its own drainer re-claimed", func(ctx SpecContext, idIndex bool) {
		spec := db.CanonicalOutbox(ctx)
		if !idIndex {
			db.Exec(ctx, "ALTER TABLE "+spec.Name+" DROP CONSTRAINT "+spec.ObjectName("_pkey"))
		}
		db.Seed(ctx, spec.Name, 1)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(store.Table().SettlesByID()).To(Equal(idIndex), "how the settles find the row")
		first, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(first.Rows).To(HaveLen(1))
		// The first claim's lease expires while its batch is still pending,
		// and the same drainer claims the row again.
		db.Exec(ctx, "UPDATE "+spec.Name+" SET claimed_at = now() - interval '31 seconds', available_at = now() - interval '1 second'")
		second, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(second.Rows).To(HaveLen(1))

		policy := outbox.FailurePolicy{InitialMillis: 1000, MaxMillis: 1000, MaxAttempts: 10}
		done, err := store.Settle(ctx, "drainer-a", outbox.Settlement{Failed: first.Leases(), Failures: []outbox.Failure{{Reason: "confirm of the first claim lost"}}}, policy)
		Expect(err).NotTo(HaveOccurred())
		Expect(done.Failed).To(BeZero(), "the first claim's settle changed nothing")
		done, err = store.Settle(ctx, "drainer-a", outbox.Settlement{Published: second.Leases()}, policy)
		Expect(err).NotTo(HaveOccurred())
		Expect(done.Published).To(Equal(int64(1)))
		Expect(db.Count(ctx, spec.Name, "published_at IS NOT NULL AND attempts = 0")).To(Equal(1),
			"published by the second claim, with no attempt counted by the first")
	},
		Entry("found through the index on the id", true),
		Entry("found by TID, on a table without one", false),
	)

	It("deletes the confirmed rows it still holds when published rows are not kept, and leaves a row another claim took over", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 3)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		held, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(held.Rows).To(HaveLen(3))
		// One row's lease expires and drainer-b takes it over.
		taken := held.Rows[0].ID
		db.Exec(ctx, "UPDATE "+spec.Name+" SET claimed_at = now() - interval '31 seconds', available_at = now() - interval '1 second' WHERE id::text = $1", taken)
		other, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(other.Rows).To(HaveLen(1))

		done, err := store.Settle(ctx, "drainer-a", outbox.Settlement{Published: held.Leases(), DeletePublished: true}, outbox.FailurePolicy{})
		Expect(err).NotTo(HaveOccurred())
		Expect(done.Published).To(Equal(int64(2)), "the two rows still held")
		Expect(db.IDs(ctx, spec.Name, "true")).To(ConsistOf(taken))
		Expect(db.Count(ctx, spec.Name, "claimed_by = 'drainer-b' AND published_at IS NULL")).To(Equal(1), "left to its new claim")
	})
})

var _ = Describe("Recording failures", Label(tier.DB), func() {
	It("waits out the far end's Retry-After up to the policy's most, and poisons at once a row the far end says is gone", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 4)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		held, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(held.Rows).To(HaveLen(4))
		policy := outbox.FailurePolicy{InitialMillis: 1000, MaxMillis: 600_000, MaxAttempts: 10}
		failures := []outbox.Failure{
			{Reason: "HTTP 500"},
			{Reason: "HTTP 429, Retry-After 120", RetryAfter: 2 * time.Minute},
			{Reason: "HTTP 503, Retry-After 1 day", RetryAfter: 24 * time.Hour},
			{Reason: "HTTP 410 Gone", Poison: true},
		}
		done, err := store.Settle(ctx, "drainer-a", outbox.Settlement{Failed: held.Leases(), Failures: failures}, policy)
		Expect(err).NotTo(HaveOccurred())
		Expect(done.Failed).To(Equal(int64(4)))
		waits := map[string]string{}
		rows, err := pool.Query(ctx, "SELECT id::text, last_error, attempts, CASE WHEN available_at = 'infinity' THEN 'infinity' "+
			"ELSE round(extract(epoch FROM available_at - now()))::text END FROM "+spec.Name)
		Expect(err).NotTo(HaveOccurred())
		for rows.Next() {
			var id, lastError, wait string
			var attempts int
			Expect(rows.Scan(&id, &lastError, &attempts, &wait)).To(Succeed())
			waits[lastError] = fmt.Sprintf("%d attempts, due in %s", attempts, wait)
		}
		Expect(rows.Err()).NotTo(HaveOccurred())
		Expect(waits).To(Equal(map[string]string{
			"HTTP 500":                    "1 attempts, due in 1",
			"HTTP 429, Retry-After 120":   "1 attempts, due in 120",
			"HTTP 503, Retry-After 1 day": "1 attempts, due in 600",
			"HTTP 410 Gone":               "10 attempts, due in infinity",
		}))
	})
})
