package drainer

import (
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("Draining existing tables through the column mapping", Label(tier.DB, tier.Broker), func() {
	It("drains an event_outbox whose routing key is the payload's event_type", func(ctx SpecContext) {
		name := "public." + testenv.UniqueName("event_outbox")
		db.Exec(ctx, `CREATE TABLE `+name+` (
			id uuid PRIMARY KEY DEFAULT gen_random_uuid(), payload jsonb NOT NULL,
			enqueued_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz,
			claimed_at timestamptz, claimed_by text, attempts int NOT NULL DEFAULT 0, last_error text)`)
		db.DropAfterTest(name)
		spec := outbox.TableSpec{Name: name, RoutingKey: outbox.RoutingKey{PayloadField: "event_type"}}
		before := db.Schema(ctx, name)
		_, err := outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(db.Schema(ctx, name)).To(HaveLen(len(before)+4), "only available_at, parked_at and the claim and published indexes are added")

		db.Exec(ctx, "INSERT INTO "+name+` (payload) SELECT jsonb_build_object('event_type', 'invoice.paid', 'n', g) FROM generate_series(1, 50) g`)
		topo := topology("invoice.paid", nil)
		startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))

		msgs, err := testenv.Consume(amqpChannel(), topo.Queue, 50, drainTimeout)
		Expect(err).NotTo(HaveOccurred())
		Expect(msgs[0].RoutingKey).To(Equal("invoice.paid"))
		Eventually(func() int { return db.Count(ctx, name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		var got []string
		for _, m := range msgs {
			got = append(got, m.MessageId)
		}
		Expect(got).To(ConsistOf(db.IDs(ctx, name, "true")))
	})

	It("drains an athena_outbox after migrate adds only its lease columns and parked_at", func(ctx SpecContext) {
		name := "public." + testenv.UniqueName("athena_outbox")
		db.Exec(ctx, `CREATE TABLE `+name+` (
			event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
			event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now(),
			available_at timestamptz NOT NULL DEFAULT now(), attempts int NOT NULL DEFAULT 0, last_error text, published_at timestamptz)`)
		db.DropAfterTest(name)
		spec := outbox.TableSpec{Name: name, Columns: outbox.Columns{ID: "event_id", EnqueuedAt: "created_at"}}
		before := db.Schema(ctx, name)

		done, err := outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(ConsistOf("added column claimed_at", "added column claimed_by", "added column parked_at", HaveSuffix("_spillway_claim_idx"), HaveSuffix("_spillway_published_idx")))
		after := db.Schema(ctx, name)
		Expect(after).To(ContainElements(before), "nothing renamed or changed")
		Expect(after).To(HaveLen(len(before) + 5))

		db.Exec(ctx, `INSERT INTO `+name+` (aggregate_type, aggregate_id, event_type, payload, headers)
			SELECT 'order', g::text, 'order.shipped', jsonb_build_object('n', g), jsonb_build_object('aggregate', 'order')
			FROM generate_series(1, 50) g`)
		topo := topology("order.shipped", nil)
		startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))

		msgs, err := testenv.Consume(amqpChannel(), topo.Queue, 50, drainTimeout)
		Expect(err).NotTo(HaveOccurred())
		Expect(msgs[0].Headers).To(HaveKeyWithValue("aggregate", "order"))
		Eventually(func() int { return db.Count(ctx, name, "published_at IS NULL") }, drainTimeout, 50*time.Millisecond).Should(BeZero())
		var got []string
		for _, m := range msgs {
			got = append(got, m.MessageId)
		}
		var want []string
		rows, err := pool.Query(ctx, "SELECT event_id::text FROM "+name)
		Expect(err).NotTo(HaveOccurred())
		want, err = pgx.CollectRows(rows, pgx.RowTo[string])
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(ConsistOf(want))
	})
})
