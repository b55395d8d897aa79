package drainer

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/testenv"
)

// partitionedOutbox creates an outbox with the canonical columns,
// range-partitioned by enqueued_at at boundary into an old and a new
// partition, as large outboxes are kept small. It returns the spec and the
// partitions' names.
func partitionedOutbox(ctx context.Context, boundary time.Time) (spec TableSpec, partitions []string) {
	name := "public." + testenv.UniqueName("parted_outbox")
	exec(ctx, `CREATE TABLE `+name+` (
		id uuid NOT NULL DEFAULT gen_random_uuid(), event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb,
		enqueued_at timestamptz NOT NULL DEFAULT now(), available_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz,
		claimed_at timestamptz, claimed_by text, attempts integer NOT NULL DEFAULT 0, last_error text,
		PRIMARY KEY (id, enqueued_at)) PARTITION BY RANGE (enqueued_at)`)
	dropAfterTest(name)
	at := boundary.UTC().Format(time.RFC3339Nano)
	partitions = []string{name + "_old", name + "_new"}
	exec(ctx, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (MINVALUE) TO ('%s')", partitions[0], name, at))
	exec(ctx, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO (MAXVALUE)", partitions[1], name, at))
	return TableSpec{Name: name}, partitions
}

// indexesOn lists the definitions of the indexes of one table.
func indexesOn(ctx context.Context, table string) []string {
	var defs []string
	rows, err := pool.Query(ctx, "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = to_regclass($1) AND indisvalid", table)
	Expect(err).NotTo(HaveOccurred())
	for rows.Next() {
		var d string
		Expect(rows.Scan(&d)).To(Succeed())
		defs = append(defs, d)
	}
	Expect(rows.Err()).NotTo(HaveOccurred())
	return defs
}

var _ = Describe("A partitioned outbox", Label("integration"), func() {
	It("is migrated with the claim and published indexes on the parent and on every partition, and a second run changes nothing", func(ctx SpecContext) {
		spec, partitions := partitionedOutbox(ctx, time.Now().Add(-24*time.Hour))
		done, err := Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(ContainElements("created index "+spec.objectName(claimIndexSuffix), "created index "+spec.objectName(publishedIndexSuffix)))
		for _, table := range append([]string{spec.Name}, partitions...) {
			Expect(indexesOn(ctx, table)).To(ContainElements(
				ContainSubstring("WHERE (published_at IS NULL)"), ContainSubstring("WHERE (published_at IS NOT NULL)")), table)
		}
		done, err = Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(BeEmpty())

		later := spec.Name + "_later"
		exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", spec.Name, partitions[1]))
		exec(ctx, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO (MAXVALUE)",
			later, spec.Name, time.Now().Add(-24*time.Hour).UTC().Format(time.RFC3339Nano)))
		DeferCleanup(func(ctx SpecContext) { exec(ctx, "DROP TABLE IF EXISTS "+partitions[1]) })
		Expect(indexesOn(ctx, later)).To(ContainElement(ContainSubstring("WHERE (published_at IS NULL)")),
			"a partition created later inherits the claim index")
	})

	It("is settled by table oid and ctid: a look-up by id would probe every partition's index for each row", func(ctx SpecContext) {
		spec, _ := partitionedOutbox(ctx, time.Now().Add(-24*time.Hour))
		_, err := Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		store, err := OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(store.Table().settleByID).To(BeFalse())
		Expect(store.Table().MarkPublished("d", nil).SQL).To(ContainSubstring("o.ctid = s.tid"))
	})

	It("is drained under retention without deleting a pending row or publishing one twice", func(ctx SpecContext) {
		spec, _ := partitionedOutbox(ctx, time.Now().Add(-24*time.Hour))
		_, err := Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		// The old partition: 500 rows published two days ago and 1,000
		// pending; the new one: 1,000 rows due in 4 s.
		exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at, published_at)
			SELECT 'order.created', jsonb_build_object('n', g), now() - interval '3 days', now() - interval '2 days' FROM generate_series(1, 500) g`)
		exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at)
			SELECT 'order.created', jsonb_build_object('n', g), now() - interval '2 days' FROM generate_series(1, 1000) g`)
		exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, available_at)
			SELECT 'order.created', jsonb_build_object('n', g), now() + interval '4 seconds' FROM generate_series(1, 1000) g`)
		pending := ids(ctx, spec.Name, "published_at IS NULL")
		topo := topology("#", nil)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		published := time.Hour
		cfg.Retention = Retention{Published: &published, Interval: 50 * time.Millisecond, BatchSize: 100}
		startDrainer(ctx, cfg)

		Eventually(func() int { return count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		Eventually(func() int { return count(ctx, spec.Name, "true") }, drainTimeout).Should(Equal(2000),
			"the 500 rows published two days ago are pruned")
		Expect(ids(ctx, spec.Name, "true")).To(ConsistOf(pending), "no pending row was deleted")
		publishedOnce(ctx, spec.Name, topo.Queue)
	})
})

var _ = Describe("A table migrate did not finish", Label("integration"), func() {
	It("is refused by the drainer, which names the missing claim index and says to run migrate", func(ctx SpecContext) {
		name := "public." + testenv.UniqueName("unmigrated")
		exec(ctx, `CREATE TABLE `+name+` (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), event_type text NOT NULL, payload jsonb NOT NULL,
			enqueued_at timestamptz NOT NULL DEFAULT now(), available_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz,
			claimed_at timestamptz, claimed_by text, attempts integer NOT NULL DEFAULT 0, last_error text)`)
		dropAfterTest(name)
		_, err := OpenStore(ctx, pool, TableSpec{Name: name})
		Expect(err).To(MatchError(And(ContainSubstring(TableSpec{Name: name}.objectName(claimIndexSuffix)), ContainSubstring("run spillway migrate"))))
	})
})
