package drainer

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("A partitioned outbox", Label(tier.DB, tier.Broker), func() {
	It("is drained under retention without deleting a pending row or publishing one twice", func(ctx SpecContext) {
		spec, _ := db.PartitionedOutbox(ctx, time.Now().Add(-24*time.Hour))
		_, err := outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		// The old partition: 500 rows published two days ago and 1,000
		// pending; the new one: 1,000 rows due in 4 s.
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at, published_at)
			SELECT 'order.created', jsonb_build_object('n', g), now() - interval '3 days', now() - interval '2 days' FROM generate_series(1, 500) g`)
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at)
			SELECT 'order.created', jsonb_build_object('n', g), now() - interval '2 days' FROM generate_series(1, 1000) g`)
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, available_at)
			SELECT 'order.created', jsonb_build_object('n', g), now() + interval '4 seconds' FROM generate_series(1, 1000) g`)
		pending := db.IDs(ctx, spec.Name, "published_at IS NULL")
		topo := topology("#", nil)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		published := time.Hour
		cfg.Retention = Retention{Published: &published, Interval: 50 * time.Millisecond, BatchSize: 100}
		startDrainer(ctx, cfg)

		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		Eventually(func() int { return db.Count(ctx, spec.Name, "true") }, drainTimeout).Should(Equal(2000),
			"the 500 rows published two days ago are pruned")
		Expect(db.IDs(ctx, spec.Name, "true")).To(ConsistOf(pending), "no pending row was deleted")
		publishedOnce(ctx, spec.Name, topo.Queue)
	})
})
