package outbox_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/tier"
)

// seqs returns the aggregate and seq of each claimed row.
func seqs(ctx context.Context, table string, c outbox.Claimed) []string {
	var out []string
	for _, r := range c.Rows {
		var key string
		var seq int
		Expect(pool.QueryRow(ctx, "SELECT aggregate_id, (payload->>'seq')::int FROM "+table+" WHERE id = $1", r.ID).Scan(&key, &seq)).To(Succeed())
		Expect(r.Key).To(HaveValue(Equal(key)), "the claim returns the row's key")
		out = append(out, fmt.Sprintf("%s/%d", key, seq))
	}
	return out
}

var _ = Describe("Per-key ordering", Label(tier.DB), func() {
	var policy = outbox.FailurePolicy{InitialMillis: 60_000, MaxMillis: 60_000, MaxAttempts: 10}

	It("claims only the head of each key, and the next row of a key once its head is published", func(ctx SpecContext) {
		spec := db.OrderedOutbox(ctx, "")
		db.SeedKeys(ctx, spec.Name, 3, 3)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())

		first, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 100))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, first)).To(Equal([]string{"k0/1", "k1/1", "k2/1"}))
		Expect(first.Scanned).To(Equal(9))
		Expect(db.Count(ctx, spec.Name, "available_at = "+outbox.WaitingDue)).To(Equal(6), "the later rows wait behind their heads")

		again, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 100))
		Expect(err).NotTo(HaveOccurred())
		Expect(again.Rows).To(BeEmpty(), "no key has a second row in flight")

		done, err := store.Settle(ctx, "drainer-a", outbox.Settlement{Published: first.Leases()[:2], Released: first.Leases()[2:],
			Advanced: []string{"k0", "k1"}}, policy)
		Expect(err).NotTo(HaveOccurred())
		Expect(done.Woken).To(Equal(int64(2)))
		next, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 100))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, next)).To(ConsistOf("k0/2", "k1/2", "k2/1"), "the released head of k2 is claimed again, before k2/2")
	})

	It("lets a key's next row go once its head is deleted as published, when published rows are not kept", func(ctx SpecContext) {
		spec := db.OrderedOutbox(ctx, "")
		db.SeedKeys(ctx, spec.Name, 2, 2)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		heads, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 100))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, heads)).To(Equal([]string{"k0/1", "k1/1"}))

		done, err := store.Settle(ctx, "drainer-a", outbox.Settlement{Published: heads.Leases(), Advanced: []string{"k0", "k1"}, DeletePublished: true}, policy)
		Expect(err).NotTo(HaveOccurred())
		Expect(done.Published).To(Equal(int64(2)))
		Expect(done.Woken).To(Equal(int64(2)))
		Expect(db.Count(ctx, spec.Name, "true")).To(Equal(2), "the heads are gone")
		next, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 100))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, next)).To(Equal([]string{"k0/2", "k1/2"}))
	})

	It("keeps a late commit with an earlier enqueued_at waiting while a later row of its key is in flight", func(ctx SpecContext) {
		spec := db.OrderedOutbox(ctx, "")
		db.SeedKeys(ctx, spec.Name, 1, 1)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		held, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(held.Rows).To(HaveLen(1))
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, aggregate_id, enqueued_at, available_at)
			VALUES ('order.created', '{"seq": 0}', 'k0', now() - interval '2 hours', now() - interval '2 hours')`)

		late, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(late.Rows).To(BeEmpty())
		Expect(db.Count(ctx, spec.Name, "available_at = "+outbox.WaitingDue)).To(Equal(1))
		_, err = store.Settle(ctx, "drainer-a", outbox.Settlement{Published: held.Leases(), Advanced: []string{"k0"}}, policy)
		Expect(err).NotTo(HaveOccurred())
		after, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, after)).To(Equal([]string{"k0/0"}))
	})

	// headInFlight claims key k0's only row as drainer-a, then commits the
	// key's next row while the head is in flight, as an application's next
	// event of the aggregate is.
	headInFlight := func(ctx context.Context) (outbox.TableSpec, *outbox.Store, outbox.Claimed) {
		spec := db.OrderedOutbox(ctx, "")
		db.SeedKeys(ctx, spec.Name, 1, 1)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		held, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(held.Rows).To(HaveLen(1))
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, aggregate_id) VALUES ('order.created', '{"seq": 2}', 'k0')`)
		return spec, store, held
	}

	It("leaves a row due, neither claimed nor sent to wait, while its key's head is being settled", func(ctx SpecContext) {
		spec, store, held := headInFlight(ctx)

		// The head's settle has published it and looked for a waiting row
		// to wake, and has not committed: a claim now still sees the head
		// in flight, and a row it sent to wait would wait for the sweep.
		settle, err := pool.Begin(ctx)
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = settle.Rollback(context.WithoutCancel(ctx)) }()
		for _, stmt := range []outbox.Statement{store.Table().MarkPublished("drainer-a", held.Leases()), store.Table().WakeSuccessors([]string{"k0"}, 10)} {
			_, err := settle.Exec(ctx, stmt.SQL, stmt.Args...)
			Expect(err).NotTo(HaveOccurred())
		}
		during, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(during.Rows).To(BeEmpty())
		Expect(during.Deferred).To(Equal(1))
		Expect(db.Count(ctx, spec.Name, "available_at = "+outbox.WaitingDue)).To(BeZero(), "not sent to wait")

		Expect(settle.Commit(ctx)).To(Succeed())
		after, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, after)).To(Equal([]string{"k0/2"}))
	})

	It("makes the head's settle wait for a claim that sent a row to wait behind it, so that its wake-up sees the row", func(ctx SpecContext) {
		spec, store, held := headInFlight(ctx)

		claim, err := pool.Begin(ctx)
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = claim.Rollback(context.WithoutCancel(ctx)) }()
		stmt := store.Table().Claim(suite.ClaimParams("drainer-b", 10))
		_, err = claim.Exec(ctx, stmt.SQL, stmt.Args...)
		Expect(err).NotTo(HaveOccurred())

		settled := make(chan outbox.Settled, 1)
		go func() {
			defer GinkgoRecover()
			done, err := store.Settle(ctx, "drainer-a", outbox.Settlement{Published: held.Leases(), Advanced: []string{"k0"}}, policy)
			Expect(err).NotTo(HaveOccurred())
			settled <- done
		}()
		_, table := spec.QualifiedName()
		Eventually(func() int {
			return db.Count(ctx, "pg_stat_activity", "wait_event_type = 'Lock' AND query LIKE $1", "UPDATE %"+table+"% SET %published_at%")
		}).WithContext(ctx).WithTimeout(10*time.Second).Should(Equal(1), "the settle waits for the claim's lock on the head")
		Expect(claim.Commit(ctx)).To(Succeed())
		var done outbox.Settled
		Eventually(settled).WithContext(ctx).WithTimeout(10 * time.Second).Should(Receive(&done))
		Expect(done.Published).To(Equal(int64(1)))
		Expect(done.Woken).To(Equal(int64(1)), "the wake-up sees the row the claim sent to wait")
		after, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, after)).To(Equal([]string{"k0/2"}))
	})

	It("under block, keeps a failed row's key waiting while it backs off and while it is poisoned, and counts the key blocked", func(ctx SpecContext) {
		spec := db.OrderedOutbox(ctx, outbox.OnFailureBlock)
		db.SeedKeys(ctx, spec.Name, 2, 2)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		c, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, c)).To(Equal([]string{"k0/1", "k1/1"}))
		_, err = store.Settle(ctx, "drainer-a", outbox.Settlement{Failed: c.Leases()[:1], Failures: []outbox.Failure{{Reason: "returned"}},
			Published: c.Leases()[1:], Advanced: []string{"k1"}}, policy)
		Expect(err).NotTo(HaveOccurred())

		next, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, next)).To(Equal([]string{"k1/2"}), "k0 waits for its failed head")
		blocked := readBlockedKeys(ctx, store)
		Expect(blocked.Count).To(Equal(int64(1)))
		Expect(blocked.OldestKey).To(Equal("k0"))

		// Poisoned: still blocking. The sweep leaves k0/2 waiting.
		db.Exec(ctx, "UPDATE "+spec.Name+" SET available_at = 'infinity', attempts = 10 WHERE aggregate_id = 'k0' AND attempts = 1")
		Expect(store.WakeStranded(ctx, 10, 100)).To(BeZero())
		Expect(db.Count(ctx, spec.Name, "aggregate_id = 'k0' AND available_at = "+outbox.WaitingDue)).To(Equal(1))
		Expect(readBlockedKeys(ctx, store).Count).To(Equal(int64(1)))

		// Parked, the poisoned head holds back nothing: the sweep wakes k0/2.
		db.Exec(ctx, "UPDATE "+spec.Name+" SET parked_at = now() WHERE aggregate_id = 'k0' AND attempts = 10")
		Expect(store.WakeStranded(ctx, 10, 100)).To(Equal(int64(1)))
		last, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, last)).To(Equal([]string{"k0/2"}))
		Expect(readBlockedKeys(ctx, store).Count).To(BeZero())
	})

	It("under skip, poisons a failed row at once and lets the next row of its key go", func(ctx SpecContext) {
		spec := db.OrderedOutbox(ctx, outbox.OnFailureSkip)
		db.SeedKeys(ctx, spec.Name, 1, 3)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		c, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, c)).To(Equal([]string{"k0/1"}))
		// As a drainer settles a failure under skip: its first poisons it,
		// and its key's next row goes.
		failure := outbox.Settlement{Failed: c.Leases(), Failures: []outbox.Failure{{Reason: "returned"}}, Advanced: []string{"k0"}}
		_, err = store.Settle(ctx, "drainer-a", failure, outbox.FailurePolicy{InitialMillis: 1000, MaxMillis: 1000, MaxAttempts: 1})
		Expect(err).NotTo(HaveOccurred())
		Expect(db.Count(ctx, spec.Name, "available_at = 'infinity' AND attempts = 1")).To(Equal(1), "poisoned at its first failure")

		next, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, next)).To(Equal([]string{"k0/2"}))
		Expect(readBlockedKeys(ctx, store).Count).To(BeZero(), "a poisoned row under skip blocks nothing, and the probe reads no blocked keys under skip")
	})

	It("orders the rows of a partitioned outbox across its partitions", func(ctx SpecContext) {
		spec, partitions := db.PartitionedOutbox(ctx, time.Now().Add(-30*time.Minute))
		db.Exec(ctx, "ALTER TABLE "+spec.Name+" ADD COLUMN aggregate_id text")
		spec.Ordering = outbox.Ordering{KeyColumn: "aggregate_id"}
		_, err := outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		for _, p := range partitions {
			Expect(indexesOn(ctx, p)).To(ContainElement(ContainSubstring("(aggregate_id, enqueued_at, id) WHERE (published_at IS NULL)")), p)
		}
		// k0's first row is in the old partition, its second in the new.
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, aggregate_id, enqueued_at, available_at)
			VALUES ('order.created', '{"seq": 1}', 'k0', now() - interval '1 hour', now()),
			       ('order.created', '{"seq": 2}', 'k0', now(), now() - interval '2 hours')`)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		c, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, c)).To(Equal([]string{"k0/1"}), "the second row, due first, waits for the first")
		_, err = store.Settle(ctx, "drainer-a", outbox.Settlement{Published: c.Leases(), Advanced: []string{"k0"}}, policy)
		Expect(err).NotTo(HaveOccurred())
		c, err = store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(seqs(ctx, spec.Name, c)).To(Equal([]string{"k0/2"}))
	})

	It("refuses a drainer on a table whose ordering indexes migrate has not built", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Exec(ctx, "ALTER TABLE "+spec.Name+" ADD COLUMN aggregate_id text")
		spec.Ordering = outbox.Ordering{KeyColumn: "aggregate_id"}
		_, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).To(MatchError(ContainSubstring(spec.ObjectName(outbox.OrderIndexSuffix) + " on " + spec.Name + " is missing: run spillway migrate")))
	})

})

var _ = Describe("The ordered claim's cost", Label(tier.DB), func() {
	// buffersOf seeds a fresh ordered table with keys × perKey due rows and
	// returns the shared buffers of an ordered claim of batch rows, and of
	// the unordered claim of the same rows on the same table.
	buffersOf := func(ctx context.Context, keys, perKey, batch int) (ordered, unordered int) {
		spec := db.OrderedOutbox(ctx, "")
		db.SeedKeys(ctx, spec.Name, keys, perKey)
		db.Exec(ctx, "VACUUM ANALYZE "+spec.Name)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		ordered = claimBuffers(ctx, store, suite.ClaimParams("drainer-a", batch))
		plain := spec
		plain.Ordering = outbox.Ordering{}
		store, err = outbox.OpenStore(ctx, pool, plain)
		Expect(err).NotTo(HaveOccurred())
		return ordered, claimBuffers(ctx, store, suite.ClaimParams("drainer-a", batch))
	}

	It("stays O(batch) with 100,000 distinct keys and with one hot key of 100,000 rows (EXPLAIN ANALYZE, BUFFERS)", func(ctx SpecContext) {
		const batch = 100
		fewKeys, fewKeysPlain := buffersOf(ctx, 1_000, 1, batch)
		manyKeys, manyKeysPlain := buffersOf(ctx, 100_000, 1, batch)
		smallHot, smallHotPlain := buffersOf(ctx, 1, 1_000, batch)
		hot, hotPlain := buffersOf(ctx, 1, 100_000, batch)
		GinkgoWriter.Printf("ordered claim of %d rows, shared buffers (unordered claim of the same table in brackets):\n", batch)
		GinkgoWriter.Printf("  1,000 keys × 1 row: %d (%d); 100,000 keys × 1 row: %d (%d)\n", fewKeys, fewKeysPlain, manyKeys, manyKeysPlain)
		GinkgoWriter.Printf("  1 key × 1,000 rows: %d (%d); 1 key × 100,000 rows: %d (%d)\n", smallHot, smallHotPlain, hot, hotPlain)
		AddReportEntry("ordered claim buffers", fmt.Sprintf("100k keys %d (unordered %d), hot key of 100k rows %d (unordered %d), batch %d",
			manyKeys, manyKeysPlain, hot, hotPlain, batch))
		for _, b := range []int{manyKeys, hot} {
			Expect(b).To(BeNumerically("<=", 25*batch), "bounded by the batch, not the table")
		}
		Expect(manyKeys).To(BeNumerically("<=", fewKeys*3/2+10), "100 times the keys cost the claim no more")
		Expect(hot).To(BeNumerically("<=", smallHot*3/2+10), "100 times the rows of the hot key cost the claim no more")
	})

	It("stays O(batch) beside 100,000 rows waiting behind 2,000 heads in flight", func(ctx SpecContext) {
		spec := db.OrderedOutbox(ctx, "")
		db.SeedKeys(ctx, spec.Name, 2_000, 51)
		// As a fleet leaves it: each key's head in flight, the rest waiting.
		db.Exec(ctx, `UPDATE `+spec.Name+` SET claimed_by = 'drainer-b', claimed_at = now(), available_at = now() + interval '30 seconds'
			WHERE (payload->>'seq')::int = 1`)
		db.Exec(ctx, "UPDATE "+spec.Name+" SET available_at = "+outbox.WaitingDue+" WHERE (payload->>'seq')::int > 1")
		seedFresh := `INSERT INTO ` + spec.Name + ` (event_type, payload, aggregate_id)
			SELECT 'order.created', jsonb_build_object('seq', 1), 'fresh-' || g FROM generate_series(1, 100) g`
		db.Exec(ctx, seedFresh)
		db.Exec(ctx, "VACUUM ANALYZE "+spec.Name)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		buffers := claimBuffers(ctx, store, suite.ClaimParams("drainer-a", 100))
		plain := spec
		plain.Ordering = outbox.Ordering{}
		store, err = outbox.OpenStore(ctx, pool, plain)
		Expect(err).NotTo(HaveOccurred())
		unordered := claimBuffers(ctx, store, suite.ClaimParams("drainer-a", 100))
		GinkgoWriter.Printf("claim of 100 fresh heads beside 100,000 waiting rows and 2,000 in flight: %d buffers ordered, %d unordered\n", buffers, unordered)
		AddReportEntry("ordered claim buffers beside waiting rows", fmt.Sprintf("%d (unordered %d)", buffers, unordered))
		// A lease probe through the claim index read every waiting row: over
		// a million buffers here. Through the key lease index the claim stays
		// within tens of buffers a row; how many tens varies with what
		// vacuum could clean beside the suites running at once.
		Expect(buffers).To(BeNumerically("<=", 100*100),
			"bounded by the batch: the lease probe reads the key lease index, not the 100,000 waiting rows")
	})
})

// readBlockedKeys reads the table's blocked keys as the operator does.
func readBlockedKeys(ctx context.Context, store *outbox.Store) outbox.BlockedKeys {
	b, err := outbox.ReadBlockedKeys(ctx, pool, store.Table(), 0)
	Expect(err).NotTo(HaveOccurred())
	return b
}
