package outbox_test

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
)

var _ = Describe("Resolving the table mapping", func() {
	canonical := []outbox.CatalogColumn{
		{Name: "id", Type: "uuid"}, {Name: "payload", Type: "jsonb"}, {Name: "event_type", Type: "text"},
		{Name: "headers", Type: "jsonb"}, {Name: "enqueued_at", Type: "timestamp with time zone"},
		{Name: "available_at", Type: "timestamp with time zone"}, {Name: "published_at", Type: "timestamp with time zone"},
		{Name: "claimed_at", Type: "timestamp with time zone"}, {Name: "claimed_by", Type: "text"},
		{Name: "attempts", Type: "integer"}, {Name: "last_error", Type: "text"},
	}
	without := func(names ...string) []outbox.CatalogColumn {
		var out []outbox.CatalogColumn
	next:
		for _, c := range canonical {
			for _, n := range names {
				if c.Name == n {
					continue next
				}
			}
			out = append(out, c)
		}
		return out
	}

	It("quotes every identifier it renders", func() {
		t, err := outbox.ResolveTable(outbox.TableSpec{Name: "app.Outbox"}, canonical)
		Expect(err).NotTo(HaveOccurred())
		stmt := t.Claim(outbox.ClaimParams{DrainerID: "d", BatchSize: 1, MaxAttempts: 1})
		Expect(stmt.SQL).To(ContainSubstring(`"app"."Outbox"`))
		Expect(stmt.SQL).To(ContainSubstring(`"claimed_by" = $1`))
	})

	It("leaves out optional columns the table does not have", func() {
		t, err := outbox.ResolveTable(outbox.TableSpec{Name: "outbox"}, without("headers", "last_error"))
		Expect(err).NotTo(HaveOccurred())
		claim := t.Claim(outbox.ClaimParams{DrainerID: "d", BatchSize: 1, MaxAttempts: 1}).SQL
		Expect(claim).To(ContainSubstring("NULL::jsonb"))
		fail := t.RecordFailures("d", nil, nil, outbox.FailurePolicy{}).SQL
		Expect(fail).NotTo(ContainSubstring("last_error"))
	})

	It("resolves a table without available_at, so the operator can read its status before migrate adds it", func() {
		t, err := outbox.ResolveTable(outbox.TableSpec{Name: "outbox"}, without("available_at"))
		Expect(err).NotTo(HaveOccurred())
		Expect(t.OutboxStatus(10).SQL).NotTo(ContainSubstring("available_at"))
	})

	It("names a missing required column and says migrate can add a lease column", func() {
		_, err := outbox.ResolveTable(outbox.TableSpec{Name: "outbox"}, without("claimed_at"))
		Expect(err).To(MatchError(ContainSubstring(`database.columns.claimedAt: Not found: "claimed_at in public.outbox (spillway migrate adds it)"`)))
	})

	It("rejects an explicitly mapped optional column that does not exist", func() {
		_, err := outbox.ResolveTable(outbox.TableSpec{Name: "outbox", Columns: outbox.Columns{Headers: "meta"}}, canonical)
		Expect(err).To(MatchError(ContainSubstring("database.columns.headers: Not found")))
	})

	It("rejects an id type it cannot round-trip", func() {
		cols := append(without("id"), outbox.CatalogColumn{Name: "id", Type: "numeric"})
		_, err := outbox.ResolveTable(outbox.TableSpec{Name: "outbox"}, cols)
		Expect(err).To(MatchError(ContainSubstring(`database.columns.id: Invalid value: "numeric"`)))
	})

	It("takes the routing key from a payload field only for a JSON payload", func() {
		cols := append(without("payload", "event_type"), outbox.CatalogColumn{Name: "payload", Type: "bytea"})
		_, err := outbox.ResolveTable(outbox.TableSpec{Name: "outbox", RoutingKey: outbox.RoutingKey{PayloadField: "type"}}, cols)
		Expect(err).To(MatchError(ContainSubstring("database.routingKey.payloadField")))
	})

	It("says a table that does not exist does not exist", func() {
		_, err := outbox.ResolveTable(outbox.TableSpec{Name: "outbox"}, nil)
		Expect(err).To(MatchError(ContainSubstring("table public.outbox does not exist")))
	})

	It("orders claims by due time, the claim index's key", func() {
		t, err := outbox.ResolveTable(outbox.TableSpec{Name: "outbox"}, canonical)
		Expect(err).NotTo(HaveOccurred())
		Expect(t.Claim(outbox.ClaimParams{}).SQL).To(ContainSubstring(`ORDER BY "available_at"`))
		Expect(t.ClaimIndex()).To(Equal(outbox.IndexDef{Suffix: outbox.ClaimIndexSuffix, Columns: []string{"available_at", "attempts"}, Predicate: `"published_at" IS NULL`,
			Supersedes: []string{"available_at"}}))
		Expect(t.ClaimIndex().Create(outbox.Relation{Schema: "public", Name: "outbox"}).SQL).To(Equal(
			`CREATE INDEX CONCURRENTLY IF NOT EXISTS "outbox_spillway_claim_idx" ON "public"."outbox" ("available_at", "attempts") WHERE "published_at" IS NULL`))
		Expect(t.ClaimIndex().Create(outbox.Relation{Schema: "public", Name: "outbox", Partitioned: true}).SQL).To(Equal(
			`CREATE INDEX IF NOT EXISTS "outbox_spillway_claim_idx" ON ONLY "public"."outbox" ("available_at", "attempts") WHERE "published_at" IS NULL`),
			"Postgres refuses CONCURRENTLY on a partitioned table")
	})

	It("accepts an existing index by its columns and predicate, not by its name", func() {
		t, err := outbox.ResolveTable(outbox.TableSpec{Name: "outbox"}, canonical)
		Expect(err).NotTo(HaveOccurred())
		claim := t.ClaimIndex()
		shape := outbox.IndexShape{OnTable: true, Valid: true, Method: "btree", Columns: []string{"available_at", "attempts"}, Predicate: "(published_at IS NULL)"}
		Expect(claim.Matches(shape)).To(BeTrue(), "as pg_get_expr prints it")
		Expect(claim.Superseded(shape)).To(BeFalse())
		last := shape
		last.Columns = []string{"available_at"}
		Expect(claim.Matches(last)).To(BeFalse(), "the claim index of the last release")
		Expect(claim.Superseded(last)).To(BeTrue(), "which it supersedes")
		older := shape
		older.Columns = []string{"attempts", "enqueued_at"}
		Expect(claim.Matches(older)).To(BeFalse(), "the claim index of an earlier spillway")
		Expect(claim.Superseded(older)).To(BeFalse())
		wider := shape
		wider.Predicate = ""
		Expect(claim.Matches(wider)).To(BeFalse(), "an index over published history too")
		unique := shape
		unique.Unique = true
		Expect(claim.Matches(unique)).To(BeFalse())
		elsewhere := shape
		elsewhere.OnTable = false
		Expect(claim.Matches(elsewhere)).To(BeFalse(), "an index of that name on another table")
	})

	It("keeps the index name within Postgres's 63 bytes", func() {
		spec := outbox.TableSpec{Name: "a_very_long_outbox_table_name_that_goes_on_and_on_for_ever_x"}
		Expect(len(spec.ObjectName(outbox.ClaimIndexSuffix))).To(BeNumerically("<=", 63))
	})

	It("keeps the notify channel within Postgres's 63-byte limit, distinct per table", func() {
		short := outbox.TableSpec{Name: "public.outbox"}
		Expect(short.NotifyChannel()).To(Equal("spillway.public.outbox"))
		long := func(suffix string) outbox.TableSpec {
			return outbox.TableSpec{Name: "tenant_schema_with_a_long_name." + strings.Repeat("t", 40) + suffix}
		}
		Expect(len(long("a").NotifyChannel())).To(BeNumerically("<=", 63))
		Expect(long("a").NotifyChannel()).NotTo(Equal(long("b").NotifyChannel()))
	})
})
