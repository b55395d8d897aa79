package outbox_test

import (
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("Reading the outbox's status", Label(tier.DB), func() {
	const maxAttempts = 5

	It("counts the backlog and the poisoned rows, leaves published rows out, and ages the backlog by the database's clock", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 10)
		db.Exec(ctx, "UPDATE "+spec.Name+" SET published_at = now() WHERE id IN (SELECT id FROM "+spec.Name+" LIMIT 3)")
		db.Exec(ctx, "UPDATE "+spec.Name+" SET attempts = $1, enqueued_at = now() - interval '1 hour' WHERE id IN (SELECT id FROM "+spec.Name+" WHERE published_at IS NULL LIMIT 1)", maxAttempts)
		// Poisoned at a higher maxAttempts: its due time is 'infinity' until it is replayed.
		db.Exec(ctx, "UPDATE "+spec.Name+" SET attempts = $1, enqueued_at = now() - interval '1 hour', available_at = 'infinity' WHERE id IN (SELECT id FROM "+spec.Name+" WHERE published_at IS NULL AND attempts = 0 LIMIT 1)", maxAttempts-2)
		db.Exec(ctx, "UPDATE "+spec.Name+" SET attempts = $1 - 1 WHERE id IN (SELECT id FROM "+spec.Name+" WHERE published_at IS NULL AND attempts = 0 LIMIT 1)", maxAttempts)
		db.Exec(ctx, "UPDATE "+spec.Name+" SET enqueued_at = now() - interval '90 seconds' WHERE id IN (SELECT id FROM "+spec.Name+" WHERE published_at IS NULL AND attempts = 0 LIMIT 1)")
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())

		status, err := outbox.ReadOutboxStatus(ctx, pool, store.Table(), maxAttempts)
		Expect(err).NotTo(HaveOccurred())
		Expect(status.Backlog).To(Equal(int64(5)), "10 rows, 3 published, 2 poisoned (at maxAttempts, or never due again); a row one attempt short is still backlog")
		Expect(status.Poisoned).To(Equal(int64(2)))
		Expect(status.AgeKnown).To(BeTrue())
		Expect(status.OldestPendingAge).To(BeNumerically(">=", 90*time.Second), "the back-dated backlog row, not the hour-old poisoned ones")
		Expect(status.OldestPendingAge).To(BeNumerically("<", 2*time.Minute))
	})

	It("reports an empty backlog as zero age", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		status, err := outbox.ReadOutboxStatus(ctx, pool, store.Table(), maxAttempts)
		Expect(err).NotTo(HaveOccurred())
		Expect(status).To(Equal(outbox.OutboxStatus{AgeKnown: true, ParkedKnown: true}))
	})

	It("counts through the column mapping, and cannot age a table without an enqueue time", func(ctx SpecContext) {
		name := "public." + testenv.UniqueName("legacy_outbox")
		db.Exec(ctx, "CREATE TABLE "+name+` (event_id bigserial PRIMARY KEY, body jsonb NOT NULL, event_type text,
			sent_at timestamptz, claimed_at timestamptz, claimed_by text, tries integer NOT NULL DEFAULT 0)`)
		db.DropAfterTest(name)
		db.Exec(ctx, "INSERT INTO "+name+" (body, event_type, sent_at, tries) VALUES ('{}', 'a', NULL, 0), ('{}', 'a', NULL, 9), ('{}', 'a', now(), 0)")
		spec := outbox.TableSpec{Name: name, Columns: outbox.Columns{ID: "event_id", Payload: "body", PublishedAt: "sent_at", Attempts: "tries"}}
		// As the operator reads it: through the mapping, before migrate.
		cols, err := outbox.Catalog(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		table, err := outbox.ResolveTable(spec, cols)
		Expect(err).NotTo(HaveOccurred())

		status, err := outbox.ReadOutboxStatus(ctx, pool, table, maxAttempts)
		Expect(err).NotTo(HaveOccurred())
		Expect(status).To(Equal(outbox.OutboxStatus{Backlog: 1, Poisoned: 1}))
	})

	It("stops counting at its limit and says the numbers are lower bounds, and runs read-only under the probe's limits", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 25)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())

		exact, err := outbox.ReadBoundedOutboxStatus(ctx, pool, store.Table(), maxAttempts, 100)
		Expect(err).NotTo(HaveOccurred())
		Expect(exact.Backlog).To(Equal(int64(25)))
		Expect(exact.Capped).To(BeFalse(), "below the limit the counts are exact")

		tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = tx.Rollback(ctx) }()
		limits := outbox.ProbeLimits(1500 * time.Millisecond)
		_, err = tx.Exec(ctx, limits.SQL, limits.Args...)
		Expect(err).NotTo(HaveOccurred())
		var timeout string
		Expect(tx.QueryRow(ctx, "SHOW statement_timeout").Scan(&timeout)).To(Succeed())
		Expect(timeout).To(Equal("1500ms"))
		capped, err := outbox.ReadBoundedOutboxStatus(ctx, tx, store.Table(), maxAttempts, 10)
		Expect(err).NotTo(HaveOccurred())
		Expect(capped.Backlog).To(Equal(int64(10)), "at least 10")
		Expect(capped.Capped).To(BeTrue())
	})

	It("reads the claim index, not the published history", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 20_000)
		db.Exec(ctx, "UPDATE "+spec.Name+" SET published_at = now() WHERE id IN (SELECT id FROM "+spec.Name+" LIMIT 19000)")
		db.Exec(ctx, "VACUUM ANALYZE "+spec.Name)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		stmt := store.Table().OutboxStatus(maxAttempts)

		rows, err := pool.Query(ctx, "EXPLAIN "+stmt.SQL, stmt.Args...)
		Expect(err).NotTo(HaveOccurred())
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		Expect(err).NotTo(HaveOccurred())
		plan := strings.Join(lines, "\n")
		Expect(plan).To(ContainSubstring(spec.ObjectName(outbox.ClaimIndexSuffix)))
		Expect(plan).NotTo(ContainSubstring("Seq Scan"))
	})
})

var _ = Describe("Scrubbing a last error", func() {
	It("merges causes that read the same once scrubbed, and keeps the three with most rows", func() {
		at := func(h int) *time.Time { return ptrTo(time.Date(2026, 1, 1, h, 0, 0, 0, time.UTC)) }
		got := outbox.TopPoisonCauses(
			[]string{"a", "pwd=1 b", "pwd=2 b", "c", "d"},
			[]int64{3, 2, 2, 2, 1},
			[]*time.Time{at(5), at(4), at(2), nil, at(1)}, nil)
		Expect(got).To(Equal([]outbox.PoisonCause{
			{LastError: "pwd=xxxxx b", Count: 4, OldestEnqueuedAt: at(2)},
			{LastError: "a", Count: 3, OldestEnqueuedAt: at(5)},
			{LastError: "c", Count: 2},
		}))
	})
})

func ptrTo[T any](v T) *T { return &v }
