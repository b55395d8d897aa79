package probe

import (
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestProbe(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Probe Suite")
}

var _ = Describe("The Prober's schedule", func() {
	p := New(nil, nil, nil, Options{MaxBackoff: 5 * time.Minute})

	DescribeTable("reads a healthy outbox every status interval, and a failing one ever less often, up to the cap",
		func(interval time.Duration, failures int, wait time.Duration) {
			Expect(p.backoff(interval, failures)).To(Equal(wait))
		},
		Entry("healthy", 15*time.Second, 0, 15*time.Second),
		Entry("first failure: at the interval", 15*time.Second, 1, 15*time.Second),
		Entry("second failure: twice", 15*time.Second, 2, 30*time.Second),
		Entry("fifth failure", 15*time.Second, 5, 240*time.Second),
		Entry("capped", 15*time.Second, 9, 5*time.Minute),
		Entry("never sooner than a long interval", 10*time.Minute, 3, 10*time.Minute),
	)
})

var _ = Describe("The connection pools", func() {
	It("share one pool per database URL, and close those no fleet uses once idle", func() {
		ps := newPools(time.Second)
		DeferCleanup(ps.closeAll)
		a, err := ps.get("postgres://spillway@db-a.example:5432/app")
		Expect(err).NotTo(HaveOccurred())
		again, err := ps.get("postgres://spillway@db-a.example:5432/app")
		Expect(err).NotTo(HaveOccurred())
		Expect(again).To(BeIdenticalTo(a), "reused, not reopened")
		b, err := ps.get("postgres://spillway@db-b.example:5432/app")
		Expect(err).NotTo(HaveOccurred())
		Expect(b).NotTo(BeIdenticalTo(a))
		Expect(a.Config().MaxConns).To(BeEquivalentTo(maxConnsPerDatabase))
		Expect(a.Config().ConnConfig.RuntimeParams).To(HaveKeyWithValue("application_name", "spillway-operator"))

		ps.closeUnused(map[string]bool{"postgres://spillway@db-a.example:5432/app": true})
		Expect(ps.byURL).To(HaveLen(2), "b was used a moment ago: a read may not have recorded it yet")
		ps.byURL["postgres://spillway@db-b.example:5432/app"].lastUsed = time.Now().Add(-time.Minute)
		ps.closeUnused(map[string]bool{"postgres://spillway@db-a.example:5432/app": true})
		Expect(ps.byURL).To(HaveKey("postgres://spillway@db-a.example:5432/app"))
		Expect(ps.byURL).NotTo(HaveKey("postgres://spillway@db-b.example:5432/app"))
	})

	It("refuses a URL that is not a Postgres connection string", func() {
		_, err := newPools(time.Second).get("postgres://spillway@db:notaport/app")
		Expect(err).To(HaveOccurred())
	})
})
