package drainer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

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

var _ = Describe("Refusals", func() {
	It("are the database's answers that waiting out a connection would not cure", func() {
		Expect(refusal(fmt.Errorf("claim batch: %w", &pgconn.PgError{Code: "42P01"}))).NotTo(BeNil(), "found through wrapping")
		Expect(refusal(&pgconn.PgError{Code: "42501"})).NotTo(BeNil())
		Expect(refusal(&pgconn.PgError{Code: "53100"})).NotTo(BeNil(), "a full disk")
		for _, code := range []string{"08006", "08P01", "57P01", "57P03", "53300"} {
			Expect(refusal(&pgconn.PgError{Code: code})).To(BeNil(), code)
		}
		Expect(refusal(errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"))).To(BeNil())
		Expect(refusal(nil)).To(BeNil())
	})

	It("make the drainer unready after three in a row of one statement, until it succeeds, and are logged at the first, the third, and once a minute", func() {
		metrics := NewMetrics(prometheus.NewRegistry())
		r := newRefusals("public.outbox", metrics)
		gone := fmt.Errorf("claim batch: %w", &pgconn.PgError{Severity: "ERROR", Message: `relation "public.outbox" does not exist`, Code: "42P01"})
		start := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
		var logged []bool
		fail := func(err error, at time.Duration) failureStreak {
			streak, log := r.failed(statementClaim, err, start.Add(at))
			logged = append(logged, log)
			return streak
		}

		fail(gone, 0)
		fail(gone, time.Second)
		Expect(r.cause()).To(Succeed(), "two refusals")
		fail(errors.New("connection reset by peer"), 2*time.Second)
		fail(gone, 3*time.Second)
		fail(gone, 4*time.Second)
		Expect(r.cause()).To(Succeed(), "a lost connection broke the run")
		streak := fail(gone, 5*time.Second)
		Expect(streak.refused).To(Equal(3))
		Expect(r.cause()).To(MatchError(`claims on public.outbox fail: ERROR: relation "public.outbox" does not exist (SQLSTATE 42P01); 6 tries in a row since 2026-12-06T10:00:00Z`))
		Expect(testutil.ToFloat64(metrics.StatementFailing.WithLabelValues(statementClaim, "42P01"))).To(Equal(1.0))
		fail(gone, 30*time.Second)
		fail(gone, 66*time.Second)
		Expect(logged).To(Equal([]bool{true, false, false, false, false, true, false, true}))
		Expect(testutil.ToFloat64(metrics.StatementErrors.WithLabelValues(statementClaim, "42P01"))).To(Equal(7.0))
		Expect(testutil.ToFloat64(metrics.StatementErrors.WithLabelValues(statementClaim, "connection"))).To(Equal(1.0))

		Expect(r.succeeded(statementSettle).tries).To(BeZero(), "another statement's success ends nothing")
		Expect(r.cause()).To(HaveOccurred())
		Expect(r.succeeded(statementClaim).tries).To(Equal(8))
		Expect(r.cause()).To(Succeed())
		Expect(testutil.CollectAndCount(metrics.StatementFailing)).To(BeZero())
	})
})
