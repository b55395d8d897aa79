package drainer

import (
	"strconv"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("Latency buckets", func() {
	It("run from 0.5 ms to 0.5 ms × 2^doublings, two to each doubling, each a short le label", func() {
		b := latencyBuckets(15)
		Expect(b).To(HaveLen(31))
		Expect(b[0]).To(Equal(0.0005))
		Expect(b[30]).To(Equal(16.384))
		var labels []string
		for i, edge := range b {
			if i > 0 {
				Expect(edge).To(BeNumerically(">", b[i-1]))
			}
			labels = append(labels, strconv.FormatFloat(edge, 'g', -1, 64))
		}
		Expect(labels[:6]).To(Equal([]string{"0.0005", "0.000707", "0.001", "0.00141", "0.002", "0.00283"}))
		Expect(labels[29]).To(Equal("11.6"))
	})
})
