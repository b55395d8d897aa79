package drainer

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var _ = Describe("Refusals", func() {

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
