package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("Migrate", Label(tier.DB), func() {
	It("creates the canonical table with its claim and published indexes, and a second run changes nothing", func(ctx SpecContext) {
		spec := outbox.TableSpec{Name: "public." + testenv.UniqueName("outbox")}
		db.DropAfterTest(spec.Name)
		done, err := outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(ConsistOf("created table "+spec.Name, "created index "+spec.ObjectName(outbox.ClaimIndexSuffix),
			"created index "+spec.ObjectName(outbox.PublishedIndexSuffix)))
		before := db.Schema(ctx, spec.Name)
		Expect(before).To(ContainElement(ContainSubstring("(available_at, attempts) WHERE (published_at IS NULL)")))
		Expect(before).To(ContainElement(ContainSubstring("(published_at) WHERE (published_at IS NOT NULL)")))
		Expect(db.Count(ctx, "pg_class", "oid = to_regclass($1) AND reloptions @> '{fillfactor=50}'", spec.Name)).To(Equal(1),
			"room on each page for claims to be HOT updates")
		Expect(db.Count(ctx, "pg_class", "oid = to_regclass($1) AND reloptions @> '{autovacuum_vacuum_scale_factor=0,autovacuum_vacuum_threshold=100000}'", spec.Name)).To(Equal(1),
			"vacuumed by its dead rows, not by its size")

		done, err = outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(BeEmpty())
		Expect(db.Schema(ctx, spec.Name)).To(Equal(before))
	})

	It("gives the canonical table's rows version 7 uuids, which follow the time they were inserted", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 1000)
		// The clock, not a timestamp column, makes the id, so nothing can be
		// back-dated: 2 ms put the next row past the millisecond the seed
		// ended in, where an id read at its end may sort early.
		db.Exec(ctx, "SELECT pg_sleep(0.002)")
		db.Exec(ctx, "INSERT INTO "+spec.Name+` (event_type, payload) VALUES ('order.created', '{"late": true}')`)
		Expect(db.Count(ctx, spec.Name, "substr(id::text, 15, 1) = '7' AND substr(id::text, 20, 1) IN ('8', '9', 'a', 'b')")).To(Equal(1001),
			"version 7, RFC 9562 variant")
		Expect(db.Count(ctx, "(SELECT DISTINCT id FROM "+spec.Name+") d", "true")).To(Equal(1001))
		Expect(db.Count(ctx, spec.Name, "abs(('x' || lpad(replace(substr(id::text, 1, 13), '-', ''), 16, '0'))::bit(64)::bigint"+
			" - extract(epoch FROM clock_timestamp()) * 1000) > 60000")).To(BeZero(), "the first 48 bits are the Unix time in milliseconds")
		Expect(db.Count(ctx, spec.Name, "payload ->> 'late' IS NOT NULL AND id > ALL (SELECT id FROM "+spec.Name+" WHERE payload ->> 'late' IS NULL)")).
			To(Equal(1), "a row inserted later sorts after the earlier statement's")
	})

	It("installs the notify trigger once, and it notifies the drainers' channel once per inserting statement", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		installed, err := outbox.InstallNotifyTrigger(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(installed).To(BeTrue())
		installed, err = outbox.InstallNotifyTrigger(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(installed).To(BeFalse(), "a second run changes nothing")

		conn, err := pool.Acquire(ctx)
		Expect(err).NotTo(HaveOccurred())
		defer conn.Release()
		_, err = conn.Exec(ctx, spec.Listen().SQL)
		Expect(err).NotTo(HaveOccurred())
		defer conn.Exec(ctx, "UNLISTEN *") //nolint:errcheck
		db.Seed(ctx, spec.Name, 100)
		n, err := conn.Conn().WaitForNotification(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(n.Channel).To(Equal(spec.NotifyChannel()))
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err = conn.Conn().WaitForNotification(short)
		Expect(err).To(HaveOccurred(), "100 rows in one statement notify once")
	})

	It("replaces a claim index left invalid by an interrupted build", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Exec(ctx, "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass($1)", "public."+spec.ObjectName(outbox.ClaimIndexSuffix))
		done, err := outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(ConsistOf("created index " + spec.ObjectName(outbox.ClaimIndexSuffix)))
		Expect(db.Count(ctx, "pg_index", "indexrelid = to_regclass($1) AND indisvalid", "public."+spec.ObjectName(outbox.ClaimIndexSuffix))).To(Equal(1))
	})

	It("replaces a claim index of spillway's name but another shape, as an earlier spillway built it", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		index := "public." + spec.ObjectName(outbox.ClaimIndexSuffix)
		db.Exec(ctx, "DROP INDEX "+index)
		db.Exec(ctx, "CREATE INDEX "+spec.ObjectName(outbox.ClaimIndexSuffix)+" ON "+spec.Name+" (attempts, enqueued_at) WHERE published_at IS NULL")
		_, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).To(MatchError(ContainSubstring("is not the index migrate builds: run spillway migrate")))

		done, err := outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(ConsistOf("created index " + spec.ObjectName(outbox.ClaimIndexSuffix)))
		Expect(db.Schema(ctx, spec.Name)).To(ContainElement(ContainSubstring("(available_at, attempts) WHERE (published_at IS NULL)")))
		_, err = outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
	})

	It("rebuilds the claim index of the last release, on the due time alone, beside it, and a drainer drains through it meanwhile", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		name := spec.ObjectName(outbox.ClaimIndexSuffix)
		db.Exec(ctx, "DROP INDEX public."+name)
		db.Exec(ctx, "CREATE INDEX "+name+" ON "+spec.Name+" (available_at) WHERE published_at IS NULL")
		// A rebuild an interrupted run left behind, invalid.
		db.Exec(ctx, "CREATE INDEX "+name+"_rebuild ON "+spec.Name+" (available_at, attempts) WHERE published_at IS NULL")
		db.Exec(ctx, "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass($1)", "public."+name+"_rebuild")
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(store.Notes()).To(ConsistOf(fmt.Sprintf("index %s on %s is on (available_at), as an earlier release built it: claims read the rows they pass over from the table; "+
			"run spillway migrate, which rebuilds it on (available_at, attempts)", name, spec.Name)))
		db.Seed(ctx, spec.Name, 3)
		c, err := store.Claim(ctx, suite.ClaimParams("drainer-a", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Rows).To(HaveLen(3))

		done, err := outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(ConsistOf("rebuilt index " + name + " on (available_at, attempts)"))
		indexes := db.Schema(ctx, spec.Name)
		Expect(indexes).To(ContainElement(ContainSubstring(name + " ON public." + strings.TrimPrefix(spec.Name, "public.") + " USING btree (available_at, attempts) WHERE (published_at IS NULL)")))
		Expect(indexes).NotTo(ContainElement(ContainSubstring("_rebuild")))
		Expect(db.Count(ctx, "pg_index", "indexrelid = to_regclass($1) AND indisvalid", "public."+name)).To(Equal(1))
		store, err = outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(store.Notes()).To(BeEmpty())
		done, err = outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(BeEmpty())
	})

	It("refuses a table without a payload column rather than inventing one", func(ctx SpecContext) {
		name := "public." + testenv.UniqueName("notes")
		db.Exec(ctx, "CREATE TABLE "+name+" (id bigserial PRIMARY KEY, body text, published_at timestamptz)")
		db.DropAfterTest(name)
		_, err := outbox.Migrate(ctx, pool, outbox.TableSpec{Name: name})
		Expect(err).To(MatchError(ContainSubstring("database.columns.payload: Not found")))
	})
})
