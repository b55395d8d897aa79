package outbox

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("The operator's connection pools", func() {
	It("share one pool per database URL, and close those no fleet uses once idle", func() {
		r := NewReader(time.Second)
		DeferCleanup(r.Close)
		a, err := r.pool("postgres://spillway@db-a.example:5432/app")
		Expect(err).NotTo(HaveOccurred())
		again, err := r.pool("postgres://spillway@db-a.example:5432/app")
		Expect(err).NotTo(HaveOccurred())
		Expect(again).To(BeIdenticalTo(a), "reused, not reopened")
		b, err := r.pool("postgres://spillway@db-b.example:5432/app")
		Expect(err).NotTo(HaveOccurred())
		Expect(b).NotTo(BeIdenticalTo(a))
		Expect(a.Config().MaxConns).To(BeEquivalentTo(maxConnsPerDatabase))
		Expect(a.Config().ConnConfig.RuntimeParams).To(HaveKeyWithValue("application_name", "spillway-operator"))

		r.CloseUnused(map[string]bool{"postgres://spillway@db-a.example:5432/app": true})
		Expect(r.byURL).To(HaveLen(2), "b was used a moment ago: a read may not have recorded it yet")
		r.byURL["postgres://spillway@db-b.example:5432/app"].lastUsed = time.Now().Add(-time.Minute)
		r.CloseUnused(map[string]bool{"postgres://spillway@db-a.example:5432/app": true})
		Expect(r.byURL).To(HaveKey("postgres://spillway@db-a.example:5432/app"))
		Expect(r.byURL).NotTo(HaveKey("postgres://spillway@db-b.example:5432/app"))
	})

	It("refuses a URL that is not a Postgres connection string", func() {
		_, err := NewReader(time.Second).pool("postgres://spillway@db:notaport/app")
		Expect(err).To(MatchError(InvalidURLError{}))
	})
})
