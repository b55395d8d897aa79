package secret

import (
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/tier"
)

func TestSecret(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Secret Suite")
}

var _ = Describe("Redacting connection strings", func() {
	It("hides a URL's password and keeps the rest", func() {
		Expect(RedactURL("amqp://app:s3cr3t@rabbit:5672/vh")).To(Equal("amqp://app:xxxxx@rabbit:5672/vh"))
	})
	It("hides a key/value DSN's password", func() {
		Expect(RedactURL("host=db user=app password=s3cr3t dbname=x")).NotTo(ContainSubstring("s3cr3t"))
	})
})

var _ = Describe("Scrubbing an error", func() {
	It("removes a known secret, a URL's password, key=value secrets and bearer tokens, then cuts it within a character", func() {
		Expect(Scrub("dial amqp://u:pw@h/ password=abc token: 'x y' Bearer eyJ.x", "nothing")).
			To(Equal("dial amqp://u:xxxxx@h/ password=xxxxx token: xxxxx Bearer xxxxx"))
		Expect(Scrub("login with hunter22 refused", "postgres://app:hunter22@db/x")).To(Equal("login with xxxxx refused"))
		Expect(Scrub("a\n\tb\x00c")).To(Equal("a b c"))
		cut := Scrub(strings.Repeat("€", 300))
		Expect(cut).To(HaveSuffix("…"))
		Expect(strings.ToValidUTF8(cut, "?")).To(Equal(cut))
	})
})
