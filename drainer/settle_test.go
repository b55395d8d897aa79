package drainer

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
)

var _ = Describe("A settlement", func() {
	It("keeps last_error short, cut within a character", func() {
		b := &batch{claim: outbox.Claimed{Rows: []outbox.Row{{ID: "1"}}},
			outcomes: []outcome{{kind: failed, reason: reasonConnectionFailures, detail: strings.Repeat("é", 3000)}}}
		st := settlementOf([]*batch{b}, false)
		Expect(st.Failures).To(HaveLen(1))
		Expect(len(st.Failures[0].Reason)).To(BeNumerically("<=", maxLastErrorLength+len("…")))
		Expect(strings.ToValidUTF8(st.Failures[0].Reason, "?")).To(Equal(st.Failures[0].Reason))
	})
})
