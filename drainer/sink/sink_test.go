package sink

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/tier"
)

func TestSink(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Sink Suite")
}

var _ = Describe("A message's content type", func() {
	It("derives the content type from the payload column's type", func() {
		Expect(ContentType("jsonb")).To(Equal("application/json"))
		Expect(ContentType("bytea")).To(Equal("application/octet-stream"))
		Expect(ContentType("text")).To(HavePrefix("text/plain"))
	})
})
