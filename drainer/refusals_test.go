package drainer

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/testenv"
)

var _ = Describe("Rehearsing the drainers' statements", Label("integration"), func() {
	// asRole runs fn in a read-only transaction as a new role granted
	// privileges on table, as the operator reads an outbox.
	asRole := func(ctx context.Context, table, privileges string, fn func(pgx.Tx)) {
		role := testenv.UniqueName("rehearsal")
		exec(ctx, "CREATE ROLE "+role)
		DeferCleanup(func(ctx SpecContext) { exec(ctx, "DROP OWNED BY "+role+"; DROP ROLE "+role) })
		exec(ctx, "GRANT "+privileges+" ON "+table+" TO "+role)
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, "SET LOCAL ROLE "+role)
		Expect(err).NotTo(HaveOccurred())
		fn(tx)
	}

	DescribeTable("passes when the drainers could claim and settle, and names the statement, the table and the SQLSTATE when the database would refuse them, running none",
		func(ctx SpecContext, ordered bool, privileges, refused string) {
			spec := canonicalOutbox(ctx)
			if ordered {
				spec = orderedOutbox(ctx, "")
			}
			seed(ctx, spec.Name, 10)
			table, err := ResolveOutbox(ctx, pool, spec)
			Expect(err).NotTo(HaveOccurred())
			asRole(ctx, spec.Name, privileges, func(tx pgx.Tx) {
				err := Rehearse(ctx, tx, table, 10)
				if refused == "" {
					Expect(err).NotTo(HaveOccurred())
					return
				}
				_, name := spec.QualifiedName()
				Expect(err).To(MatchError(fmt.Sprintf("the database refuses the drainers' %s on %s: ERROR: permission denied for table %s (SQLSTATE 42501)", refused, spec.Name, name)))
			})
			Expect(count(ctx, spec.Name, "claimed_by IS NULL AND published_at IS NULL")).To(Equal(10), "nothing was claimed or settled")
		},
		Entry("SELECT and UPDATE", false, "SELECT, UPDATE", ""),
		Entry("… on a table ordered per key", true, "SELECT, UPDATE", ""),
		Entry("SELECT only: claims are refused", false, "SELECT", "claims"),
		Entry("… on a table ordered per key", true, "SELECT", "claims"),
	)

	It("names a missing table by the database's answer, with its SQLSTATE", func(ctx SpecContext) {
		spec := TableSpec{Name: "public." + testenv.UniqueName("gone")}
		_, err := ResolveOutbox(ctx, pool, spec)
		Expect(err).To(MatchError(fmt.Sprintf(`table %s: ERROR: relation "%s" does not exist (SQLSTATE 42P01); run spillway migrate to create it`, spec.Name, spec.Name)))
		Expect(err).To(BeAssignableToTypeOf(&UnusableTableError{}))
	})
})
