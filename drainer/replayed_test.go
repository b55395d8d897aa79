package drainer

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

// triageMaxAttempts is the poison threshold of the replay specs.
const triageMaxAttempts = 5

// triageLease is the lease the triage specs claim under.
const triageLease = 30 * time.Second

// replay replays the poisoned rows of spec that sel picks, as an
// OutboxReplay does.
func replay(ctx context.Context, spec outbox.TableSpec, sel outbox.PoisonedSelector) outbox.PoisonedChange {
	t, err := outbox.ResolveOutbox(ctx, pool, spec)
	Expect(err).NotTo(HaveOccurred())
	done, err := outbox.ChangePoisoned(ctx, pool, t, outbox.PoisonedRequest{
		Action: outbox.ActionReplay, Selector: sel, MaxAttempts: triageMaxAttempts, Lease: triageLease, BatchSize: 2, StatementTimeout: 5 * time.Second,
	}, nil)
	Expect(err).NotTo(HaveOccurred())
	return done
}

var _ = Describe("Replayed rows", Label(tier.DB, tier.Broker), func() {
	It("are published again by a running drainer, and no other row is", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 7)
		db.Exec(ctx, "UPDATE "+spec.Name+" SET published_at = now() - interval '1 minute' WHERE id IN (SELECT id FROM "+spec.Name+" ORDER BY id LIMIT 3)")
		stuck := db.Poison(ctx, spec.Name, "published_at IS NULL", "broker returned the message: 312 NO_ROUTE", "10 minutes", triageMaxAttempts)
		topo := topology("#", nil)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.MaxAttempts = triageMaxAttempts
		startDrainer(ctx, cfg)

		done := replay(ctx, spec, outbox.PoisonedSelector{IDs: stuck[:2], Limit: 10})
		Expect(done.IDs).To(ConsistOf(stuck[:2]))
		Eventually(func() int {
			return db.Count(ctx, spec.Name, "id::text = ANY($1) AND published_at IS NOT NULL", stuck[:2])
		}).Should(Equal(2))
		got, err := testenv.Consume(amqpChannel(), topo.Queue, 2, 10*time.Second)
		Expect(err).NotTo(HaveOccurred())
		Expect([]string{got[0].MessageId, got[1].MessageId}).To(ConsistOf(stuck[:2]))
		depth, err := testenv.QueueDepth(amqpChannel(), topo.Queue)
		Expect(err).NotTo(HaveOccurred())
		Expect(depth).To(BeZero(), "the published rows and the other poisoned ones were not published")
		Expect(db.Count(ctx, spec.Name, "id::text = ANY($1) AND published_at IS NULL AND available_at = 'infinity'", stuck[2:])).To(Equal(2))
	})

	It("go back to their places in line: a drainer publishes them in the order they were enqueued, before a row enqueued after them", func(ctx SpecContext) {
		// Each row is inserted enqueued a second before the one inserted
		// before it, so the table's order is the reverse of the enqueue
		// order; the replay runs in batches of 2, the drain in claims of 5.
		spec := db.CanonicalOutbox(ctx)
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at, attempts, available_at, last_error)
			SELECT 'order.created', jsonb_build_object('n', g), now() - g * interval '1 second', $1, 'infinity', 'broker returned the message'
			FROM generate_series(1, 20) g`, triageMaxAttempts)
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload) VALUES ('order.created', '{"n": 0}')`)
		done := replay(ctx, spec, outbox.PoisonedSelector{Limit: 100})
		Expect(done.Changed).To(Equal(int64(20)))

		topo := topology("#", nil)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.MaxAttempts, cfg.BatchSize = triageMaxAttempts, 5
		startDrainer(ctx, cfg)
		got, err := testenv.Consume(amqpChannel(), topo.Queue, 21, 10*time.Second)
		Expect(err).NotTo(HaveOccurred())
		var order, want []string
		for _, m := range got {
			order = append(order, string(m.Body))
		}
		for n := 20; n >= 0; n-- {
			want = append(want, fmt.Sprintf(`{"n": %d}`, n))
		}
		Expect(order).To(Equal(want), "oldest enqueued first, the row enqueued after them last")
	})
})
