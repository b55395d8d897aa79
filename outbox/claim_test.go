package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/tier"
)

// claimBuffers runs the claim under EXPLAIN (ANALYZE, BUFFERS) in a
// transaction it rolls back, and returns the shared buffers it touched.
func claimBuffers(ctx context.Context, store *outbox.Store, p outbox.ClaimParams) int {
	stmt := store.Table().Claim(p)
	tx, err := pool.Begin(ctx)
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = tx.Rollback(ctx) }()
	var plan []map[string]any
	Expect(tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+stmt.SQL, stmt.Args...).Scan(&plan)).To(Succeed())
	top := plan[0]["Plan"].(map[string]any)
	return int(top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64))
}

// seedAged fills table as an ageing outbox holds it, with nothing due: n rows
// in backoff, n poisoned, n published long ago, and n/100 under another
// drainer's live lease.
func seedAged(ctx context.Context, table string, n int) {
	db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, enqueued_at, attempts, available_at, last_error)
		SELECT 'order.created', jsonb_build_object('n', g), now() - interval '1 day', 3, now() + interval '1 hour', 'nacked'
		FROM generate_series(1, $1) g`, n)
	db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, enqueued_at, attempts, available_at, last_error)
		SELECT 'order.created', jsonb_build_object('n', g), now() - interval '1 day', 10, 'infinity', 'returned'
		FROM generate_series(1, $1) g`, n)
	db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, enqueued_at, available_at, published_at)
		SELECT 'order.created', jsonb_build_object('n', g), now() - interval '1 day', now() - interval '1 day', now() - interval '1 hour'
		FROM generate_series(1, $1) g`, n)
	db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, claimed_at, claimed_by, available_at)
		SELECT 'order.created', jsonb_build_object('n', g), now(), 'drainer-b', now() + interval '30 seconds'
		FROM generate_series(1, $1) g`, n/100)
	db.Exec(ctx, "VACUUM ANALYZE "+table)
}

var _ = Describe("The claim", Label(tier.DB), func() {
	It("writes no index entry: on the canonical table its update is heap-only, and a row in flight is passed over by its claim time", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 1000)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		held, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 500))
		Expect(err).NotTo(HaveOccurred())
		Expect(held.Rows).To(HaveLen(500))
		Expect(db.Count(ctx, spec.Name, "claimed_by = 'drainer-a' AND available_at <= now()")).To(Equal(500), "the due time is left alone")
		// A backend reports its counts within seconds of going idle.
		updates := func() []int64 {
			var all, hot int64
			Expect(pool.QueryRow(ctx, "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $1::regclass", spec.Name).Scan(&all, &hot)).To(Succeed())
			return []int64{all, hot}
		}
		Eventually(func() int64 { return updates()[0] }).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Equal(int64(500)))
		// The claim that wrote the lease into the due time made none
		// heap-only. A page whose rows are small holds more of them than
		// half of it can take new versions of, hence not every one.
		Expect(updates()[1]).To(BeNumerically(">=", 400), "claims heap-only")

		other, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 1000))
		Expect(err).NotTo(HaveOccurred())
		Expect(other.Rows).To(HaveLen(500), "only the rows no lease holds")
		Expect(db.Count(ctx, spec.Name, "claimed_by = 'drainer-a'")).To(Equal(500), "drainer-a's rows are still its own")
	})

	It("claims a row that is due again within the claims of the rows due before it, while fresh rows keep arriving", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 5000)
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, attempts, available_at, last_error)
			VALUES ('order.created', '{"retried": true}', 1, now() + interval '200 milliseconds', 'nacked')`)
		retried := db.IDs(ctx, spec.Name, "attempts = 1")[0]
		Eventually(func() int { return db.Count(ctx, spec.Name, "attempts = 1 AND available_at <= now()") }).Should(Equal(1), "the retry is due")
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())

		const batchSize, dueBefore = 100, 5000
		for claims := 1; claims <= dueBefore/batchSize+1; claims++ {
			db.Seed(ctx, spec.Name, batchSize) // a sustained backlog: as many fresh rows arrive as each claim takes
			c, err := store.Claim(ctx, suite.ClaimParams("drainer-a", batchSize))
			Expect(err).NotTo(HaveOccurred())
			_, err = store.Settle(ctx, "drainer-a", outbox.Settlement{Published: c.Leases()}, outbox.FailurePolicy{})
			Expect(err).NotTo(HaveOccurred())
			if slices.ContainsFunc(c.Rows, func(r outbox.Row) bool { return r.ID == retried }) {
				GinkgoWriter.Printf("the retried row was claimed by claim %d\n", claims)
				return
			}
		}
		Fail(fmt.Sprintf("the retried row was not claimed within %d claims of %d rows, though only %d rows were due before it",
			dueBefore/batchSize+1, batchSize, dueBefore))
	})

	It("returns a claim's rows in due order, whatever their places in the table, with and without per-key ordering", func(ctx SpecContext) {
		// Each row is inserted due a second before the one inserted before
		// it, as rows land in pages freed by vacuum, so the table's order
		// is the reverse of the due order; with per-key ordering, each row
		// has a key of its own.
		for _, spec := range []outbox.TableSpec{db.CanonicalOutbox(ctx), db.OrderedOutbox(ctx, "")} {
			columns, values := "", ""
			if spec.Ordering.Enabled() {
				columns, values = ", aggregate_id", ", 'k' || g"
			}
			db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, available_at, enqueued_at`+columns+`)
				SELECT 'order.created', jsonb_build_object('n', g), now() - g * interval '1 second', now() - g * interval '1 second'`+values+`
				FROM generate_series(1, 20) g`)
			store, err := outbox.OpenStore(ctx, pool, spec)
			Expect(err).NotTo(HaveOccurred())
			c, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 100))
			Expect(err).NotTo(HaveOccurred())
			var got []string
			for _, r := range c.Rows {
				got = append(got, string(r.Payload))
			}
			var want []string
			for n := 20; n >= 1; n-- {
				want = append(want, fmt.Sprintf(`{"n": %d}`, n))
			}
			Expect(got).To(Equal(want), "the oldest due first (ordering key %q)", spec.Ordering.KeyColumn)
		}
	})

	// seedSpent puts n spent rows, due for a day, in front of the live rows:
	// at attempts, with a finite due time, as rows poisoned under an older
	// maxAttempts or adopted with their table are; parked rows made due by
	// hand; and rows in backoff and published history beside them.
	seedSpent := func(ctx context.Context, table string, n int, attempts string) {
		db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, enqueued_at, available_at, attempts, last_error)
			SELECT 'order.created', jsonb_build_object('spent', g), now() - interval '1 day', now() - interval '1 day' + g * interval '1 ms', `+attempts+`, 'returned'
			FROM generate_series(1, $1) g`, n)
		db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, enqueued_at, available_at, parked_at)
			SELECT 'order.created', jsonb_build_object('parked', g), now() - interval '1 day', now() - interval '1 day', now() - interval '1 hour'
			FROM generate_series(1, 100) g`)
		db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, attempts, available_at) SELECT 'order.created', '{}', 2, now() + interval '1 hour' FROM generate_series(1, 1000)`)
		db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, published_at) SELECT 'order.created', '{}', now() FROM generate_series(1, 1000)`)
	}

	DescribeTable("claims the live rows behind spent rows in one claim, leaving the spent rows unlocked and unchanged",
		func(ctx SpecContext, ordered bool, maxAttempts int, attempts string) {
			spec := db.CanonicalOutbox(ctx)
			if ordered {
				spec = db.OrderedOutbox(ctx, "")
			}
			seedSpent(ctx, spec.Name, 20_000, attempts)
			if ordered { // keys of their own, which the spent rows block
				db.Exec(ctx, "UPDATE "+spec.Name+" SET aggregate_id = 's' || (payload->>'spent') WHERE payload ? 'spent'")
			}
			db.Seed(ctx, spec.Name, 50)
			const spent = "(payload ? 'spent' OR parked_at IS NOT NULL)"
			store, err := outbox.OpenStore(ctx, pool, spec)
			Expect(err).NotTo(HaveOccurred())
			p := suite.ClaimParams("drainer-a", 100)
			p.MaxAttempts = maxAttempts

			c, err := store.Claim(ctx, p)
			Expect(err).NotTo(HaveOccurred())
			Expect(c.Rows).To(HaveLen(50), "every live row, in the first claim")
			for _, r := range c.Rows {
				Expect(string(r.Payload)).To(MatchRegexp(`^\{"n": \d+\}$`), "a live row")
			}
			Expect(c.Due).To(Equal(50))
			Expect(c.Full(p.BatchSize)).To(BeFalse(), "nothing more is due")
			Expect(db.Count(ctx, spec.Name, spent+" AND xmax = 0 AND available_at < now()")).To(Equal(20_100), "no spent row was locked or changed")
		},
		Entry("20,000 rows poisoned at maxAttempts with a finite due time, as an adopted table keeps them", false, 10, "10"),
		Entry("20,000 rows at attempts 3 to 9 once maxAttempts is lowered from 10 to 3", false, 3, "3 + g % 7"),
		Entry("… on a table ordered per key", true, 3, "3 + g % 7"),
	)

	It("shelves spent rows in short batches, oldest first: they stay poisoned or parked, and nothing else changes", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		seedSpent(ctx, spec.Name, 2_500, "3 + g % 7")
		db.Seed(ctx, spec.Name, 50)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		status := func() outbox.OutboxStatus {
			o, err := outbox.ReadOutboxStatus(ctx, pool, store.Table(), 3)
			Expect(err).NotTo(HaveOccurred())
			o.PoisonedBy, o.OldestPendingAge = nil, 0
			return o
		}
		before := status()
		Expect(before.Poisoned).To(Equal(int64(2_500)))

		batch := store.Table().ShelveSpent(3, time.Minute, 1000)
		Expect(db.Exec(ctx, batch.SQL, batch.Args...)).To(Equal(int64(1000)), "one batch")
		Expect(db.Count(ctx, spec.Name, "available_at = 'infinity' AND (parked_at IS NOT NULL OR (payload->>'spent')::int <= 900)")).To(Equal(1000),
			"the oldest due first: the parked rows, then the spent rows by due time")
		n, err := store.ShelveSpent(ctx, 3, time.Minute, 1000)
		Expect(err).NotTo(HaveOccurred())
		Expect(n).To(Equal(int64(1_600)), "the rest of the spent rows and the parked rows, in batches")

		Expect(db.Count(ctx, spec.Name, "available_at = 'infinity'")).To(Equal(2_600))
		Expect(db.Count(ctx, spec.Name, "available_at = 'infinity' AND parked_at IS NOT NULL")).To(Equal(100), "parked rows stay parked")
		Expect(db.Count(ctx, spec.Name, "available_at <= now() AND published_at IS NULL")).To(Equal(50), "the live rows stay due")
		Expect(db.Count(ctx, spec.Name, "attempts = 2 AND available_at > now() AND available_at < 'infinity'")).To(Equal(1000), "rows in backoff keep their due time")
		Expect(status()).To(Equal(before), "the status counts the same rows as poisoned, parked and backlog")
		n, err = store.ShelveSpent(ctx, 3, time.Minute, 1000)
		Expect(err).NotTo(HaveOccurred())
		Expect(n).To(BeZero())
	})

	It("reads a constant number of buffers when nothing is due, with 100,000 rows in backoff, 100,000 poisoned and 100,000 published", func(ctx SpecContext) {
		small, large := db.CanonicalOutbox(ctx), db.CanonicalOutbox(ctx)
		seedAged(ctx, small.Name, 1_000)
		seedAged(ctx, large.Name, 100_000)
		var buffers []int
		for _, spec := range []outbox.TableSpec{small, large} {
			store, err := outbox.OpenStore(ctx, pool, spec)
			Expect(err).NotTo(HaveOccurred())
			buffers = append(buffers, claimBuffers(ctx, store, suite.ClaimParams("drainer-a", 100)))
		}
		GinkgoWriter.Printf("empty claim: %d buffers with 1,000 of each, %d with 100,000 of each\n", buffers[0], buffers[1])
		Expect(buffers[1]).To(BeNumerically("<=", buffers[0]+2), "the empty claim's cost does not grow with the rows it cannot claim")
		Expect(buffers[1]).To(BeNumerically("<=", 10))
	})

	It("stops at the first row that would take it over its byte budget, and claims a row larger than the budget alone", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, available_at)
			VALUES ('order.created', jsonb_build_object('pad', repeat('x', 5000)), now() - interval '1 minute')`)
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload) SELECT 'order.created', jsonb_build_object('pad', repeat('x', 380)) FROM generate_series(1, 5)`)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		p := suite.ClaimParams("drainer-a", 100)
		p.MaxClaimBytes = 1000 // two rows of 391 bytes fit, three do not

		var sizes [][]int64
		for range 4 {
			c, err := store.Claim(ctx, p)
			Expect(err).NotTo(HaveOccurred())
			var claim []int64
			for _, r := range c.Rows {
				claim = append(claim, r.Size)
			}
			sizes = append(sizes, claim)
			Expect(c.Full(p.BatchSize)).To(Equal(len(sizes) < 4), "a claim the budget cut short says more rows are due")
		}
		Expect(sizes).To(Equal([][]int64{{5011}, {391, 391}, {391, 391}, {391}}))
	})

	It("walks the budget row by row when payloads are too large to size up front, and claims the same rows", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		// Random hex does not compress: each payload is stored in over
		// 2 kB, so the claim sizes it only when its walk reaches it.
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload)
			SELECT 'order.created', jsonb_build_object('pad', (SELECT string_agg(md5(random()::text || g || i), '') FROM generate_series(1, 128) i))
			FROM generate_series(1, 5) g`)
		// And a small one, due first, sized up front.
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, available_at) VALUES ('order.created', '{"small": true}', now() - interval '1 minute')`)
		Expect(db.Count(ctx, spec.Name, "pg_column_size(payload) >= 2048")).To(Equal(5), "stored too large to size cheaply")
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		p := suite.ClaimParams("drainer-a", 100)
		p.MaxClaimBytes = 10_000 // the small row and two of 4,107 bytes fit, three of those do not

		var sizes [][]int64
		for range 3 {
			c, err := store.Claim(ctx, p)
			Expect(err).NotTo(HaveOccurred())
			var claim []int64
			for _, r := range c.Rows {
				claim = append(claim, r.Size)
				Expect(r.Payload).To(HaveLen(int(r.Size)), "the size is the payload's, as it is published")
			}
			sizes = append(sizes, claim)
		}
		Expect(sizes).To(Equal([][]int64{{15, 4107, 4107}, {4107, 4107}, {4107}}), "in due order: the small row, inserted last, first")
	})

	It("claims released rows first, ahead of the rows that were due while they were held", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 3)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		held, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 2))
		Expect(err).NotTo(HaveOccurred())
		Expect(held.Rows).To(HaveLen(2))
		left := db.IDs(ctx, spec.Name, "claimed_by IS NULL")
		Expect(left).To(HaveLen(1))
		db.Seed(ctx, spec.Name, 5) // due after the claim

		// By the settle of an unknown outcome, and by a release of every
		// claim a drainer holds, as the operator runs for a dead one.
		_, err = store.Settle(ctx, "drainer-a", outbox.Settlement{Released: held.Leases()[:1]}, outbox.FailurePolicy{})
		Expect(err).NotTo(HaveOccurred())
		_, err = store.ReleaseHeld(ctx, "drainer-a", 30*time.Second, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(db.Count(ctx, spec.Name, "claimed_by IS NULL AND available_at = '-infinity'")).To(Equal(2), "due first")

		next, err := store.Claim(ctx, suite.ClaimParams("drainer-b", 2))
		Expect(err).NotTo(HaveOccurred())
		var got []string
		for _, r := range next.Rows {
			got = append(got, r.ID)
		}
		Expect(got).To(ConsistOf(held.Rows[0].ID, held.Rows[1].ID), "before the row due since before the claim, %s", left[0])
	})

})
