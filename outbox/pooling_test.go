package outbox_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("Through a pooler in transaction mode", Label(tier.DB), func() {
	It("opens each claim and settle with the session settings, which end with its transaction, and holds no session of its own", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 3)
		// What each of the drainer's updates runs under, as a trigger sees it.
		seen := spec.Name + "_settings"
		db.Exec(ctx, "CREATE TABLE "+seen+" (stage text, seqscan text, jit text, commit text)")
		db.DropAfterTest(seen)
		db.Exec(ctx, `CREATE FUNCTION `+seen+`() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
			INSERT INTO `+seen+` VALUES (CASE WHEN NEW.published_at IS NULL THEN 'claim' ELSE 'settle' END,
				current_setting('enable_seqscan'), current_setting('jit'), current_setting('synchronous_commit'));
			RETURN NEW; END $$`)
		DeferCleanup(func(ctx SpecContext) { db.Exec(ctx, "DROP FUNCTION IF EXISTS "+seen+"() CASCADE") })
		db.Exec(ctx, "CREATE TRIGGER seen AFTER UPDATE ON "+spec.Name+" FOR EACH ROW EXECUTE FUNCTION "+seen+"()")

		p, err := outbox.ConnectPool(ctx, secret.URLSource{URL: testenv.DatabaseURL()},
			outbox.Pooling{Mode: outbox.PoolModeTransaction}.Options("pooled", false))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(p.Close)
		store, err := outbox.OpenStore(ctx, p, spec, outbox.TransactionPooled(nil, false))
		Expect(err).NotTo(HaveOccurred())
		Expect(store.HasSessions()).To(BeFalse())
		Expect(store.Listen(ctx, spec, func() {}, func() {})).To(MatchError(outbox.ErrNoSessions))
		_, err = store.Roster(spec).Others(ctx)
		Expect(err).To(MatchError(outbox.ErrNoSessions))
		Expect(store.NotifyHush(spec).Hush(ctx)).To(Succeed())
		Expect(store.NotifyHush(spec).Held()).To(BeFalse(), "no hush without a session to hold it on")

		claimed, err := store.Claim(ctx, suite.ClaimParams("pooled", 10))
		Expect(err).NotTo(HaveOccurred())
		Expect(claimed.Rows).To(HaveLen(3))
		done, err := store.Settle(ctx, "pooled", outbox.Settlement{Published: claimed.Leases()}, outbox.FailurePolicy{MaxAttempts: 10})
		Expect(err).NotTo(HaveOccurred())
		Expect(done.Published).To(Equal(int64(3)))
		rows, err := pool.Query(ctx, "SELECT DISTINCT stage || ' ' || seqscan || ' ' || jit || ' ' || commit FROM "+seen)
		Expect(err).NotTo(HaveOccurred())
		var settings []string
		for rows.Next() {
			var s string
			Expect(rows.Scan(&s)).To(Succeed())
			settings = append(settings, s)
		}
		Expect(settings).To(ConsistOf("claim off off off", "settle off off off"))

		var seqscan, jit, commit string
		Expect(p.QueryRow(ctx, "SELECT current_setting('enable_seqscan'), current_setting('jit'), current_setting('synchronous_commit')").
			Scan(&seqscan, &jit, &commit)).To(Succeed())
		Expect([]string{seqscan, jit, commit}).To(Equal([]string{"on", "on", "on"}), "no session setting: none outlives its transaction")
		n, err := store.ReleaseHeld(ctx, "pooled", 30*time.Second, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(n).To(BeZero())
	})
})
