package drainer

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("A read-only server", Label(tier.DB, tier.Broker), func() {
	It("is a connection failure: the drainer claims and marks nothing, counts no attempt, says why it is unready, reconnects at a poll's pace, and drains once its new sessions are writable", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		ledger := startLedger(topo.Queue)
		// The drainer's role, whose sessions turn read-only as a demoted
		// primary's do.
		role := testenv.UniqueName("spillway_demoted")
		db.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
		DeferCleanup(func(ctx SpecContext) {
			db.Exec(ctx, "DROP OWNED BY "+role)
			db.Exec(ctx, "DROP ROLE IF EXISTS "+role)
		})
		db.Exec(ctx, "GRANT SELECT, UPDATE ON "+spec.Name+" TO "+role)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.Database = secret.URLSource{URL: "postgres://" + role + "@127.0.0.1:5432/test?sslmode=disable"}
		cfg.PollInterval = time.Second
		p, err := outbox.ConnectPool(ctx, cfg.Database, cfg.Pooling.Options(cfg.DrainerID, false))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(p.Close)
		r := newDrainerOn(ctx, p, cfg).start()
		db.Seed(ctx, spec.Name, 200)
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		Eventually(func() error { return r.Ready(ctx) }, drainTimeout).Should(Succeed())

		db.Exec(ctx, "ALTER ROLE "+role+" SET default_transaction_read_only = on")
		db.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
		db.Seed(ctx, spec.Name, 200)
		readyz := func() string {
			if err := r.Ready(ctx); err != nil {
				return err.Error()
			}
			return "ok"
		}
		Eventually(readyz, 10*time.Second, 20*time.Millisecond).Should(And(
			ContainSubstring("claims on %s fail: the server is read-only, a standby or a primary demoted by a failover", spec.Name),
			ContainSubstring("SQLSTATE 25006"), ContainSubstring("reconnecting to find the primary")))
		connects := p.Stat().NewConnsCount()
		watch := 3 * time.Second
		Consistently(func() int {
			return db.Count(ctx, spec.Name, "published_at IS NULL AND (attempts > 0 OR claimed_by IS NOT NULL)")
		},
			watch, 100*time.Millisecond).Should(BeZero(), "nothing claimed, marked or counted")
		tries := testutil.ToFloat64(r.metrics.StatementErrors.WithLabelValues(statementClaim, "connection"))
		GinkgoWriter.Printf("%.0f read-only claims, %d new sessions in %s\n", tries, p.Stat().NewConnsCount()-connects, watch)
		Expect(tries).To(BeNumerically("<=", 3*watch.Seconds()+3), "at most a try a poll, not a loop")
		Expect(p.Stat().NewConnsCount()).To(BeNumerically(">", connects), "each read-only answer drops the sessions, so the next connect looks again")
		Expect(testutil.CollectAndCount(r.metrics.StatementFailing)).To(BeZero(), "not a refusal")
		Expect(ledger.Total()).To(Equal(200), "only the rows drained before")

		// Writable again, as the new primary is; the sessions dropped at the
		// last read-only answer come back on it.
		db.Exec(ctx, "ALTER ROLE "+role+" RESET default_transaction_read_only")
		Eventually(readyz, drainTimeout, 20*time.Millisecond).Should(Equal("ok"))
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		all := db.IDs(ctx, spec.Name, "true")
		Eventually(ledger.Missing).WithArguments(all).Should(BeZero())
		lost, duplicates := ledger.Account(all)
		Expect(lost).To(BeEmpty())
		Expect(duplicates).To(BeZero())
		Expect(db.Count(ctx, spec.Name, "attempts > 0")).To(BeZero(), "the read-only answers cost no row an attempt")
	})
})
