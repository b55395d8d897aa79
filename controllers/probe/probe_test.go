package probe

import (
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/tier"
)

func TestProbe(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Probe Suite")
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
