package outbox_test

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("The drainer's plans", Label(tier.DB), func() {
	// settlesFind is how every settle must find each lease's own row, not
	// every lease against every row.
	DescribeTable("stay index and TID scans under generic plans, never a scan of the table",
		func(ctx SpecContext, id, settlesFind string, rows int) {
			spec := outbox.TableSpec{Name: "public." + testenv.UniqueName("outbox")}
			db.Exec(ctx, "CREATE TABLE "+spec.Name+" (id "+id+`, event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb,
				enqueued_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz)`)
			db.DropAfterTest(spec.Name)
			_, err := outbox.Migrate(ctx, pool, spec)
			Expect(err).NotTo(HaveOccurred())
			db.Seed(ctx, spec.Name, rows)
			if rows > 1000 { // grown, and analyzed as autovacuum would; a new table is not yet
				db.Exec(ctx, "ANALYZE "+spec.Name)
			}
			expectPlans(ctx, spec, settlesFind)
		},
		Entry("settles find rows through the index on a uuid id, which prunes their pages", "uuid PRIMARY KEY DEFAULT gen_random_uuid()", "Index Cond: (id = (s.id)::uuid)", 20_000),
		Entry("… on a bigint id", "bigserial PRIMARY KEY", "Index Cond: (id = (s.id)::bigint)", 20_000),
		Entry("… on a varchar id", "varchar(64) PRIMARY KEY DEFAULT gen_random_uuid()::text", "Index Cond: ((id)::text = s.id)", 20_000),
		Entry("settles find rows by TID on a table without an index on the id", "uuid NOT NULL DEFAULT gen_random_uuid()", "TID Cond: (ctid = s.tid)", 20_000),
		// A session plans each statement once, at its first execution: a new
		// outbox or a new partition is empty then, and its plans must not
		// read the table whole once it has grown.
		Entry("… planned on an empty table, as a new outbox or partition is", "uuid PRIMARY KEY DEFAULT gen_random_uuid()", "Index Cond: (id = (s.id)::uuid)", 0),
		Entry("… planned on a new table of a few rows", "uuid PRIMARY KEY DEFAULT gen_random_uuid()", "Index Cond: (id = (s.id)::uuid)", 5),
		Entry("… planned on an empty table without an index on the id", "uuid NOT NULL DEFAULT gen_random_uuid()", "TID Cond: (ctid = s.tid)", 0),
		Entry("… planned on a new table of a few rows without an index on the id", "uuid NOT NULL DEFAULT gen_random_uuid()", "TID Cond: (ctid = s.tid)", 5),
	)
})

// expectPlans checks the generic plans of the claim and of every settle on
// spec's table, made in a session of the drainer's own.
func expectPlans(ctx context.Context, spec outbox.TableSpec, settlesFind string) {
	store, err := outbox.OpenStore(ctx, pool, spec)
	Expect(err).NotTo(HaveOccurred())
	t := store.Table()
	leases := []outbox.Lease{{ID: "00000000-0000-0000-0000-000000000001", Row: outbox.Locator{Table: 1, TID: pgtype.TID{BlockNumber: 1, OffsetNumber: 1, Valid: true}}, Token: time.Now()}}
	policy := outbox.FailurePolicy{InitialMillis: 1000, MaxMillis: 1000, MaxAttempts: 10}

	sessions, err := outbox.ConnectPool(ctx, secret.URLSource{URL: testenv.DatabaseURL()}, outbox.PoolOptions{DrainerID: "plans"})
	Expect(err).NotTo(HaveOccurred())
	defer sessions.Close()
	conn, err := sessions.Acquire(ctx)
	Expect(err).NotTo(HaveOccurred())
	defer conn.Release()
	// plan EXPLAINs the statement's generic plan, with its own arguments
	// written as literals: EXPLAIN EXECUTE takes no bound parameters.
	plan := func(stmt outbox.Statement) string {
		desc, err := conn.Conn().Prepare(ctx, "drainer_plan", stmt.SQL)
		Expect(err).NotTo(HaveOccurred(), stmt.SQL)
		defer conn.Conn().Deallocate(ctx, "drainer_plan") //nolint:errcheck
		var literals []string
		for i, arg := range stmt.Args {
			text, err := conn.Conn().TypeMap().Encode(desc.ParamOIDs[i], pgtype.TextFormatCode, arg, nil)
			Expect(err).NotTo(HaveOccurred())
			literals = append(literals, outbox.QuoteLiteral(string(text)))
		}
		rows, err := conn.Query(ctx, "EXPLAIN EXECUTE drainer_plan("+strings.Join(literals, ", ")+")")
		Expect(err).NotTo(HaveOccurred())
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		Expect(err).NotTo(HaveOccurred())
		return strings.Join(lines, "\n")
	}
	claim := plan(t.Claim(suite.ClaimParams("d", 100)))
	Expect(claim).To(ContainSubstring("Index Scan using " + spec.ObjectName(outbox.ClaimIndexSuffix)))
	// The rows taken are found in one TID scan of them all, not each in a
	// scan of its own filtered by the whole list, quadratic in the claim.
	Expect(claim).To(ContainSubstring("TID Cond: (ctid = ANY"))
	Expect(claim).To(MatchRegexp(`(Hash|Merge) Cond: .*(\(o\.ctid\)::text = \(k\.tid\)::text|\(k\.tid\)::text = \(o\.ctid\)::text)`),
		"matched to taken by a hash or a sort")
	Expect(claim).NotTo(ContainSubstring("TID Cond: (ctid = k.tid)"))
	for name, stmt := range map[string]outbox.Statement{
		"claim":     t.Claim(suite.ClaimParams("d", 100)),
		"published": t.MarkPublished("d", leases),
		"deleted":   t.DeletePublished("d", leases),
		"failed":    t.RecordFailures("d", leases, []outbox.Failure{{Reason: "x"}}, policy),
		"released":  t.Release("d", leases),
		"held":      t.ReleaseHeld("d", 30*time.Second, nil),
	} {
		p := plan(stmt)
		Expect(p).NotTo(ContainSubstring("Seq Scan on "+spec.ObjectName("")), name)
		if name != "claim" && name != "held" {
			Expect(p).To(ContainSubstring(settlesFind), name)
			Expect(p).NotTo(ContainSubstring("Join Filter"), name)
		}
	}
}
