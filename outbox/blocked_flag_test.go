package outbox_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("The broker-blocked flag", Label(tier.DB), func() {
	It("is counted by the operator's read while drainers raise it, and no longer once they lower it or their session ends", func(ctx SpecContext) {
		spec, other := db.CanonicalOutbox(ctx), db.CanonicalOutbox(ctx)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		reader := outbox.NewReader(5 * time.Second)
		DeferCleanup(reader.Close)
		blocked := func(spec outbox.TableSpec) int64 {
			h, err := reader.ReadHealth(ctx, testenv.DatabaseURL(), outbox.HealthRead{Spec: spec, MaxAttempts: 10, CountLimit: 1000})
			Expect(err).NotTo(HaveOccurred())
			return h.Status.BrokerBlocked
		}
		Expect(blocked(spec)).To(BeZero())

		a, b := store.BlockedFlag(spec), store.BlockedFlag(spec)
		DeferCleanup(a.Lower)
		DeferCleanup(b.Lower)
		Expect(a.Raise(ctx)).To(Succeed())
		Expect(a.Raise(ctx)).To(Succeed(), "raised twice, held once")
		Expect(b.Raise(ctx)).To(Succeed())
		Expect(blocked(spec)).To(Equal(int64(2)))
		Expect(blocked(other)).To(BeZero(), "another table's drainers are another count")

		a.Lower()
		// The session's backend ends a moment after the goodbye.
		Eventually(func() int64 { return blocked(spec) }, 5*time.Second, 20*time.Millisecond).Should(Equal(int64(1)))
		// A drainer that dies takes its session, and its flag, with it.
		_, err = pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objid = (hashtext($1) & 4294967295)::bigint::oid`, spec.Name)
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() int64 { return blocked(spec) }, 5*time.Second, 50*time.Millisecond).Should(BeZero())
	})
})
