package drainer

import (
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/testenv"
)

var _ = Describe("Reading the outbox's status", Label("integration"), func() {
	const maxAttempts = 5

	It("counts the backlog and the poisoned rows, leaves published rows out, and ages the backlog by the database's clock", func(ctx SpecContext) {
		spec := canonicalOutbox(ctx)
		seed(ctx, spec.Name, 10)
		exec(ctx, "UPDATE "+spec.Name+" SET published_at = now() WHERE id IN (SELECT id FROM "+spec.Name+" LIMIT 3)")
		exec(ctx, "UPDATE "+spec.Name+" SET attempts = $1, enqueued_at = now() - interval '1 hour' WHERE id IN (SELECT id FROM "+spec.Name+" WHERE published_at IS NULL LIMIT 1)", maxAttempts)
		// Poisoned at a higher maxAttempts: its due time is 'infinity' until it is replayed.
		exec(ctx, "UPDATE "+spec.Name+" SET attempts = $1, enqueued_at = now() - interval '1 hour', available_at = 'infinity' WHERE id IN (SELECT id FROM "+spec.Name+" WHERE published_at IS NULL AND attempts = 0 LIMIT 1)", maxAttempts-2)
		exec(ctx, "UPDATE "+spec.Name+" SET attempts = $1 - 1 WHERE id IN (SELECT id FROM "+spec.Name+" WHERE published_at IS NULL AND attempts = 0 LIMIT 1)", maxAttempts)
		exec(ctx, "UPDATE "+spec.Name+" SET enqueued_at = now() - interval '90 seconds' WHERE id IN (SELECT id FROM "+spec.Name+" WHERE published_at IS NULL AND attempts = 0 LIMIT 1)")
		store, err := OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())

		status, err := ReadOutboxStatus(ctx, pool, store.Table(), maxAttempts)
		Expect(err).NotTo(HaveOccurred())
		Expect(status.Backlog).To(Equal(int64(5)), "10 rows, 3 published, 2 poisoned (at maxAttempts, or never due again); a row one attempt short is still backlog")
		Expect(status.Poisoned).To(Equal(int64(2)))
		Expect(status.AgeKnown).To(BeTrue())
		Expect(status.OldestPendingAge).To(BeNumerically(">=", 90*time.Second), "the back-dated backlog row, not the hour-old poisoned ones")
		Expect(status.OldestPendingAge).To(BeNumerically("<", 2*time.Minute))
	})

	It("reports an empty backlog as zero age", func(ctx SpecContext) {
		spec := canonicalOutbox(ctx)
		store, err := OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		status, err := ReadOutboxStatus(ctx, pool, store.Table(), maxAttempts)
		Expect(err).NotTo(HaveOccurred())
		Expect(status).To(Equal(OutboxStatus{AgeKnown: true, ParkedKnown: true}))
	})

	It("counts through the column mapping, and cannot age a table without an enqueue time", func(ctx SpecContext) {
		name := "public." + testenv.UniqueName("legacy_outbox")
		exec(ctx, "CREATE TABLE "+name+` (event_id bigserial PRIMARY KEY, body jsonb NOT NULL, event_type text,
			sent_at timestamptz, claimed_at timestamptz, claimed_by text, tries integer NOT NULL DEFAULT 0)`)
		dropAfterTest(name)
		exec(ctx, "INSERT INTO "+name+" (body, event_type, sent_at, tries) VALUES ('{}', 'a', NULL, 0), ('{}', 'a', NULL, 9), ('{}', 'a', now(), 0)")
		spec := TableSpec{Name: name, Columns: Columns{ID: "event_id", Payload: "body", PublishedAt: "sent_at", Attempts: "tries"}}
		// As the operator reads it: through the mapping, before migrate.
		cols, err := Catalog(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		table, err := ResolveTable(spec, cols)
		Expect(err).NotTo(HaveOccurred())

		status, err := ReadOutboxStatus(ctx, pool, table, maxAttempts)
		Expect(err).NotTo(HaveOccurred())
		Expect(status).To(Equal(OutboxStatus{Backlog: 1, Poisoned: 1}))
	})

	It("stops counting at its limit and says the numbers are lower bounds, and runs read-only under the probe's limits", func(ctx SpecContext) {
		spec := canonicalOutbox(ctx)
		seed(ctx, spec.Name, 25)
		store, err := OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())

		exact, err := ReadBoundedOutboxStatus(ctx, pool, store.Table(), maxAttempts, 100)
		Expect(err).NotTo(HaveOccurred())
		Expect(exact.Backlog).To(Equal(int64(25)))
		Expect(exact.Capped).To(BeFalse(), "below the limit the counts are exact")

		tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = tx.Rollback(ctx) }()
		limits := ProbeLimits(1500 * time.Millisecond)
		_, err = tx.Exec(ctx, limits.SQL, limits.Args...)
		Expect(err).NotTo(HaveOccurred())
		var timeout string
		Expect(tx.QueryRow(ctx, "SHOW statement_timeout").Scan(&timeout)).To(Succeed())
		Expect(timeout).To(Equal("1500ms"))
		capped, err := ReadBoundedOutboxStatus(ctx, tx, store.Table(), maxAttempts, 10)
		Expect(err).NotTo(HaveOccurred())
		Expect(capped.Backlog).To(Equal(int64(10)), "at least 10")
		Expect(capped.Capped).To(BeTrue())
	})

	It("reads the claim index, not the published history", func(ctx SpecContext) {
		spec := canonicalOutbox(ctx)
		seed(ctx, spec.Name, 20_000)
		exec(ctx, "UPDATE "+spec.Name+" SET published_at = now() WHERE id IN (SELECT id FROM "+spec.Name+" LIMIT 19000)")
		exec(ctx, "VACUUM ANALYZE "+spec.Name)
		store, err := OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		stmt := store.Table().OutboxStatus(maxAttempts)

		rows, err := pool.Query(ctx, "EXPLAIN "+stmt.SQL, stmt.Args...)
		Expect(err).NotTo(HaveOccurred())
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		Expect(err).NotTo(HaveOccurred())
		plan := strings.Join(lines, "\n")
		Expect(plan).To(ContainSubstring(spec.objectName(claimIndexSuffix)))
		Expect(plan).NotTo(ContainSubstring("Seq Scan"))
	})
})
