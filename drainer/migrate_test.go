package drainer

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/testenv"
)

// schemaOf describes a table's columns and indexes as the catalog has them.
func schemaOf(ctx context.Context, table string) []string {
	rows, err := pool.Query(ctx, `
		SELECT 'column ' || attname || ' ' || format_type(atttypid, atttypmod) || ' ' || attnotnull
		FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped
		UNION ALL
		SELECT 'index ' || pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = to_regclass($1)
		ORDER BY 1`, table)
	Expect(err).NotTo(HaveOccurred())
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	Expect(err).NotTo(HaveOccurred())
	return out
}

var _ = Describe("Migrate", Label("integration"), func() {
	It("creates the canonical table with its claim and published indexes, and a second run changes nothing", func(ctx SpecContext) {
		spec := TableSpec{Name: "public." + testenv.UniqueName("outbox")}
		dropAfterTest(spec.Name)
		done, err := Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(ConsistOf("created table "+spec.Name, "created index "+spec.objectName(claimIndexSuffix),
			"created index "+spec.objectName(publishedIndexSuffix)))
		before := schemaOf(ctx, spec.Name)
		Expect(before).To(ContainElement(ContainSubstring("(available_at, attempts) WHERE (published_at IS NULL)")))
		Expect(before).To(ContainElement(ContainSubstring("(published_at) WHERE (published_at IS NOT NULL)")))
		Expect(count(ctx, "pg_class", "oid = to_regclass($1) AND reloptions @> '{fillfactor=50}'", spec.Name)).To(Equal(1),
			"room on each page for claims to be HOT updates")

		done, err = Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(BeEmpty())
		Expect(schemaOf(ctx, spec.Name)).To(Equal(before))
	})

	It("gives the canonical table's rows version 7 uuids, which follow the time they were inserted", func(ctx SpecContext) {
		spec := canonicalOutbox(ctx)
		seed(ctx, spec.Name, 1000)
		// The clock, not a timestamp column, makes the id, so nothing can be
		// back-dated: 2 ms put the next row past the millisecond the seed
		// ended in, where an id read at its end may sort early.
		exec(ctx, "SELECT pg_sleep(0.002)")
		exec(ctx, "INSERT INTO "+spec.Name+` (event_type, payload) VALUES ('order.created', '{"late": true}')`)
		Expect(count(ctx, spec.Name, "substr(id::text, 15, 1) = '7' AND substr(id::text, 20, 1) IN ('8', '9', 'a', 'b')")).To(Equal(1001),
			"version 7, RFC 9562 variant")
		Expect(count(ctx, "(SELECT DISTINCT id FROM "+spec.Name+") d", "true")).To(Equal(1001))
		Expect(count(ctx, spec.Name, "abs(('x' || lpad(replace(substr(id::text, 1, 13), '-', ''), 16, '0'))::bit(64)::bigint"+
			" - extract(epoch FROM clock_timestamp()) * 1000) > 60000")).To(BeZero(), "the first 48 bits are the Unix time in milliseconds")
		Expect(count(ctx, spec.Name, "payload ->> 'late' IS NOT NULL AND id > ALL (SELECT id FROM "+spec.Name+" WHERE payload ->> 'late' IS NULL)")).
			To(Equal(1), "a row inserted later sorts after the earlier statement's")
	})

	It("installs the notify trigger once, and it notifies the drainers' channel once per inserting statement", func(ctx SpecContext) {
		spec := canonicalOutbox(ctx)
		installed, err := InstallNotifyTrigger(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(installed).To(BeTrue())
		installed, err = InstallNotifyTrigger(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(installed).To(BeFalse(), "a second run changes nothing")

		conn, err := pool.Acquire(ctx)
		Expect(err).NotTo(HaveOccurred())
		defer conn.Release()
		_, err = conn.Exec(ctx, spec.Listen().SQL)
		Expect(err).NotTo(HaveOccurred())
		defer conn.Exec(ctx, "UNLISTEN *") //nolint:errcheck
		seed(ctx, spec.Name, 100)
		n, err := conn.Conn().WaitForNotification(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(n.Channel).To(Equal(spec.NotifyChannel()))
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err = conn.Conn().WaitForNotification(short)
		Expect(err).To(HaveOccurred(), "100 rows in one statement notify once")
	})

	It("replaces a claim index left invalid by an interrupted build", func(ctx SpecContext) {
		spec := canonicalOutbox(ctx)
		exec(ctx, "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass($1)", "public."+spec.objectName(claimIndexSuffix))
		done, err := Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(ConsistOf("created index " + spec.objectName(claimIndexSuffix)))
		Expect(count(ctx, "pg_index", "indexrelid = to_regclass($1) AND indisvalid", "public."+spec.objectName(claimIndexSuffix))).To(Equal(1))
	})

	It("replaces a claim index of spillway's name but another shape, as an earlier spillway built it", func(ctx SpecContext) {
		spec := canonicalOutbox(ctx)
		index := "public." + spec.objectName(claimIndexSuffix)
		exec(ctx, "DROP INDEX "+index)
		exec(ctx, "CREATE INDEX "+spec.objectName(claimIndexSuffix)+" ON "+spec.Name+" (attempts, enqueued_at) WHERE published_at IS NULL")
		_, err := OpenStore(ctx, pool, spec)
		Expect(err).To(MatchError(ContainSubstring("is not the index migrate builds: run spillway migrate")))

		done, err := Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(ConsistOf("created index " + spec.objectName(claimIndexSuffix)))
		Expect(schemaOf(ctx, spec.Name)).To(ContainElement(ContainSubstring("(available_at, attempts) WHERE (published_at IS NULL)")))
		_, err = OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
	})

	It("rebuilds the claim index of the last release, on the due time alone, beside it, and a drainer drains through it meanwhile", func(ctx SpecContext) {
		spec := canonicalOutbox(ctx)
		name := spec.objectName(claimIndexSuffix)
		exec(ctx, "DROP INDEX public."+name)
		exec(ctx, "CREATE INDEX "+name+" ON "+spec.Name+" (available_at) WHERE published_at IS NULL")
		// A rebuild an interrupted run left behind, invalid.
		exec(ctx, "CREATE INDEX "+name+"_rebuild ON "+spec.Name+" (available_at, attempts) WHERE published_at IS NULL")
		exec(ctx, "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass($1)", "public."+name+"_rebuild")
		store, err := OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(store.Notes()).To(ConsistOf(fmt.Sprintf("index %s on %s is on (available_at), as an earlier release built it: claims read the rows they pass over from the table; "+
			"run spillway migrate, which rebuilds it on (available_at, attempts)", name, spec.Name)))
		seed(ctx, spec.Name, 3)
		c, err := store.Claim(ctx, claimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Rows).To(HaveLen(3))

		done, err := Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(ConsistOf("rebuilt index " + name + " on (available_at, attempts)"))
		indexes := schemaOf(ctx, spec.Name)
		Expect(indexes).To(ContainElement(ContainSubstring(name + " ON public." + strings.TrimPrefix(spec.Name, "public.") + " USING btree (available_at, attempts) WHERE (published_at IS NULL)")))
		Expect(indexes).NotTo(ContainElement(ContainSubstring("_rebuild")))
		Expect(count(ctx, "pg_index", "indexrelid = to_regclass($1) AND indisvalid", "public."+name)).To(Equal(1))
		store, err = OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(store.Notes()).To(BeEmpty())
		done, err = Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(BeEmpty())
	})

	It("refuses a table without a payload column rather than inventing one", func(ctx SpecContext) {
		name := "public." + testenv.UniqueName("notes")
		exec(ctx, "CREATE TABLE "+name+" (id bigserial PRIMARY KEY, body text, published_at timestamptz)")
		dropAfterTest(name)
		_, err := Migrate(ctx, pool, TableSpec{Name: name})
		Expect(err).To(MatchError(ContainSubstring("database.columns.payload: Not found")))
	})
})

var _ = Describe("Draining existing tables through the column mapping", Label("integration"), func() {
	It("drains an event_outbox whose routing key is the payload's event_type", func(ctx SpecContext) {
		name := "public." + testenv.UniqueName("event_outbox")
		exec(ctx, `CREATE TABLE `+name+` (
			id uuid PRIMARY KEY DEFAULT gen_random_uuid(), payload jsonb NOT NULL,
			enqueued_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz,
			claimed_at timestamptz, claimed_by text, attempts int NOT NULL DEFAULT 0, last_error text)`)
		dropAfterTest(name)
		spec := TableSpec{Name: name, RoutingKey: RoutingKey{PayloadField: "event_type"}}
		before := schemaOf(ctx, name)
		_, err := Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(schemaOf(ctx, name)).To(HaveLen(len(before)+4), "only available_at, parked_at and the claim and published indexes are added")

		exec(ctx, "INSERT INTO "+name+` (payload) SELECT jsonb_build_object('event_type', 'invoice.paid', 'n', g) FROM generate_series(1, 50) g`)
		topo := topology("invoice.paid", nil)
		startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))

		msgs, err := testenv.Consume(amqpChannel(), topo.Queue, 50, drainTimeout)
		Expect(err).NotTo(HaveOccurred())
		Expect(msgs[0].RoutingKey).To(Equal("invoice.paid"))
		Eventually(func() int { return count(ctx, name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		var got []string
		for _, m := range msgs {
			got = append(got, m.MessageId)
		}
		Expect(got).To(ConsistOf(ids(ctx, name, "true")))
	})

	It("drains an athena_outbox after migrate adds only its lease columns and parked_at", func(ctx SpecContext) {
		name := "public." + testenv.UniqueName("athena_outbox")
		exec(ctx, `CREATE TABLE `+name+` (
			event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
			event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now(),
			available_at timestamptz NOT NULL DEFAULT now(), attempts int NOT NULL DEFAULT 0, last_error text, published_at timestamptz)`)
		dropAfterTest(name)
		spec := TableSpec{Name: name, Columns: Columns{ID: "event_id", EnqueuedAt: "created_at"}}
		before := schemaOf(ctx, name)

		done, err := Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(ConsistOf("added column claimed_at", "added column claimed_by", "added column parked_at", "created index "+spec.objectName(claimIndexSuffix),
			"created index "+spec.objectName(publishedIndexSuffix)))
		after := schemaOf(ctx, name)
		Expect(after).To(ContainElements(before), "nothing renamed or changed")
		Expect(after).To(HaveLen(len(before) + 5))

		exec(ctx, `INSERT INTO `+name+` (aggregate_type, aggregate_id, event_type, payload, headers)
			SELECT 'order', g::text, 'order.shipped', jsonb_build_object('n', g), jsonb_build_object('aggregate', 'order')
			FROM generate_series(1, 50) g`)
		topo := topology("order.shipped", nil)
		startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))

		msgs, err := testenv.Consume(amqpChannel(), topo.Queue, 50, drainTimeout)
		Expect(err).NotTo(HaveOccurred())
		Expect(msgs[0].Headers).To(HaveKeyWithValue("aggregate", "order"))
		Eventually(func() int { return count(ctx, name, "published_at IS NULL") }, drainTimeout, 50*time.Millisecond).Should(BeZero())
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
