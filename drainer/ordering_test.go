package drainer

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("Per-key ordering", Label(tier.DB, tier.Broker), func() {
	It("drains 20 keys in order with two drainers publishing at once", func(ctx SpecContext) {
		spec := db.OrderedOutbox(ctx, "")
		db.SeedKeys(ctx, spec.Name, 20, 25)
		top := topology("order.#", nil)
		for _, id := range []string{"drainer-a", "drainer-b"} {
			cfg := testConfig(id, spec, top.Exchange)
			cfg.BatchSize = 7
			startDrainer(ctx, cfg)
		}
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, 60*time.Second).Should(BeZero())
		ch := amqpChannel()
		last := map[string]int{}
		for range 500 {
			d, ok, err := ch.Get(top.Queue, true)
			Expect(err).NotTo(HaveOccurred())
			Expect(ok).To(BeTrue())
			var key string
			var seq int
			_, err = fmt.Sscanf(string(d.Body), `{"key": %q, "seq": %d}`, &key, &seq)
			Expect(err).NotTo(HaveOccurred(), string(d.Body))
			Expect(seq).To(Equal(last[key]+1), "key %s", key)
			last[key] = seq
		}
	})
})
