package outbox_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("Rehearsing the drainers' statements", Label(tier.DB), func() {
	// asRole runs fn in a read-only transaction as a new role granted
	// privileges on table, as the operator reads an outbox.
	asRole := func(ctx context.Context, table, privileges string, fn func(pgx.Tx)) {
		role := testenv.UniqueName("rehearsal")
		db.Exec(ctx, "CREATE ROLE "+role)
		DeferCleanup(func(ctx SpecContext) { db.Exec(ctx, "DROP OWNED BY "+role+"; DROP ROLE "+role) })
		db.Exec(ctx, "GRANT "+privileges+" ON "+table+" TO "+role)
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, "SET LOCAL ROLE "+role)
		Expect(err).NotTo(HaveOccurred())
		fn(tx)
	}

	DescribeTable("passes when the drainers could claim and settle, and names the statement, the table and the SQLSTATE when the database would refuse them, running none",
		func(ctx SpecContext, ordered bool, privileges, refused string) {
			spec := db.CanonicalOutbox(ctx)
			if ordered {
				spec = db.OrderedOutbox(ctx, "")
			}
			db.Seed(ctx, spec.Name, 10)
			table, err := outbox.ResolveOutbox(ctx, pool, spec)
			Expect(err).NotTo(HaveOccurred())
			asRole(ctx, spec.Name, privileges, func(tx pgx.Tx) {
				err := outbox.Rehearse(ctx, tx, table, 10)
				if refused == "" {
					Expect(err).NotTo(HaveOccurred())
					return
				}
				_, name := spec.QualifiedName()
				Expect(err).To(MatchError(fmt.Sprintf("the database refuses the drainers' %s on %s: ERROR: permission denied for table %s (SQLSTATE 42501)", refused, spec.Name, name)))
			})
			Expect(db.Count(ctx, spec.Name, "claimed_by IS NULL AND published_at IS NULL")).To(Equal(10), "nothing was claimed or settled")
		},
		Entry("SELECT and UPDATE", false, "SELECT, UPDATE", ""),
		Entry("… on a table ordered per key", true, "SELECT, UPDATE", ""),
		Entry("SELECT only: claims are refused", false, "SELECT", "claims"),
		Entry("… on a table ordered per key", true, "SELECT", "claims"),
	)

	It("names a missing table by the database's answer, with its SQLSTATE", func(ctx SpecContext) {
		spec := outbox.TableSpec{Name: "public." + testenv.UniqueName("gone")}
		_, err := outbox.ResolveOutbox(ctx, pool, spec)
		Expect(err).To(MatchError(fmt.Sprintf(`table %s: ERROR: relation "%s" does not exist (SQLSTATE 42P01); run spillway migrate to create it`, spec.Name, spec.Name)))
		Expect(err).To(BeAssignableToTypeOf(&outbox.UnusableTableError{}))
	})
})

var _ = Describe("Refusals", func() {
	It("are the database's answers that waiting out a connection would not cure", func() {
		// code is the SQLSTATE of a refusal, or "" when err is none.
		code := func(err error) string {
			r, ok := outbox.Refused(err)
			Expect(ok).To(Equal(r.SQLState != ""))
			return r.SQLState
		}
		Expect(code(fmt.Errorf("claim batch: %w", &pgconn.PgError{Code: "42P01"}))).To(Equal("42P01"), "found through wrapping")
		Expect(code(&pgconn.PgError{Code: "42501"})).To(Equal("42501"))
		Expect(code(&pgconn.PgError{Code: "53100"})).To(Equal("53100"), "a full disk")
		for _, c := range []string{"08006", "08P01", "57P01", "57P03", "53300"} {
			Expect(code(&pgconn.PgError{Code: c})).To(BeEmpty(), c)
		}
		Expect(code(errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"))).To(BeEmpty())
		Expect(code(nil)).To(BeEmpty())
	})
})
