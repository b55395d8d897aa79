package outbox_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

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

var _ = Describe("A partitioned outbox", Label(tier.DB), func() {
	It("is migrated with the claim and published indexes on the parent and on every partition, and a second run changes nothing", func(ctx SpecContext) {
		spec, partitions := db.PartitionedOutbox(ctx, time.Now().Add(-24*time.Hour))
		done, err := outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(ContainElements("created index "+spec.ObjectName(outbox.ClaimIndexSuffix), "created index "+spec.ObjectName(outbox.PublishedIndexSuffix)))
		for _, table := range append([]string{spec.Name}, partitions...) {
			Expect(indexesOn(ctx, table)).To(ContainElements(
				ContainSubstring("WHERE (published_at IS NULL)"), ContainSubstring("WHERE (published_at IS NOT NULL)")), table)
		}
		done, err = outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(BeEmpty())

		later := spec.Name + "_later"
		db.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", spec.Name, partitions[1]))
		db.Exec(ctx, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO (MAXVALUE)",
			later, spec.Name, time.Now().Add(-24*time.Hour).UTC().Format(time.RFC3339Nano)))
		DeferCleanup(func(ctx SpecContext) { db.Exec(ctx, "DROP TABLE IF EXISTS "+partitions[1]) })
		Expect(indexesOn(ctx, later)).To(ContainElement(ContainSubstring("WHERE (published_at IS NULL)")),
			"a partition created later inherits the claim index")
	})

	It("is settled by table oid and ctid: a look-up by id would probe every partition's index for each row", func(ctx SpecContext) {
		spec, _ := db.PartitionedOutbox(ctx, time.Now().Add(-24*time.Hour))
		_, err := outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(store.Table().SettlesByID()).To(BeFalse())
		Expect(store.Table().MarkPublished("d", nil).SQL).To(ContainSubstring("o.ctid = s.tid"))
	})

})

var _ = Describe("A table migrate did not finish", Label(tier.DB), func() {
	It("is refused by the drainer, which names the missing claim index and says to run migrate", func(ctx SpecContext) {
		name := "public." + testenv.UniqueName("unmigrated")
		db.Exec(ctx, `CREATE TABLE `+name+` (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), event_type text NOT NULL, payload jsonb NOT NULL,
			enqueued_at timestamptz NOT NULL DEFAULT now(), available_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz,
			claimed_at timestamptz, claimed_by text, attempts integer NOT NULL DEFAULT 0, last_error text)`)
		db.DropAfterTest(name)
		_, err := outbox.OpenStore(ctx, pool, outbox.TableSpec{Name: name})
		Expect(err).To(MatchError(And(ContainSubstring(outbox.TableSpec{Name: name}.ObjectName(outbox.ClaimIndexSuffix)), ContainSubstring("run spillway migrate"))))
	})
})
