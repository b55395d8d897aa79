package drainer

import (
	"context"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
)

// rabbitmqctl runs one rabbitmqctl command that touches only this test's own
// objects (a user of its own), never the shared broker's state.
// publishedOnce consumes the queue until every published row of table has
// arrived, and fails on a missing row or a duplicate.
func publishedOnce(ctx context.Context, table, queue string) {
	want := db.IDs(ctx, table, "published_at IS NOT NULL")
	ch := amqpChannel()
	Expect(testenv.QueueDepth(ch, queue)).To(Equal(len(want)), "one message per published row, no duplicates")
	missing, duplicates := suite.Undelivered(ch, queue, want, 30*time.Second)
	Expect(missing).To(BeEmpty(), "rows marked published but never delivered")
	Expect(duplicates).To(BeZero(), "rows published twice")
}

var _ = Describe("Classifying a confirm", Label("integration"), func() {
	It("returns for a confirm that arrived before its channel closed, instead of spinning on the closed return channel", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		d := newDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
		b, err := dialBroker(ctx, d.cfg.Broker, "drainer-a", 8, d.cfg.MaxPayloadBytes, d.log, func() {})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(b.close)
		dc, err := b.publish(ctx, "order.created", amqp.Publishing{MessageId: "row-1", Body: []byte("{}")})
		Expect(err).NotTo(HaveOccurred())
		b.flush()
		Eventually(dc.Done()).Should(BeClosed())
		Expect(b.ch.Close()).To(Succeed())

		e := inflight{batch: &batch{claim: outbox.Claim{Rows: []outbox.Row{{ID: "row-1"}}}, outcomes: make([]outcome, 1)}, confirm: dc, broker: b, publishedAt: time.Now()}
		classified := make(chan outcome, 1)
		go func() { classified <- d.classify(e, releaseConfirmTimeout) }()
		var got outcome
		Eventually(classified, 5*time.Second).Should(Receive(&got))
		Expect(got.kind).To(Equal(published), "the broker acked it before the channel closed")
	})

	It("keeps draining when its broker connection is closed under it again and again mid-drain", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		db.Seed(ctx, spec.Name, 20_000)
		d := startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
		var closed *brokerChannel
		for range 5 {
			// Settles of rows confirmed on the closed channel also count,
			// so the new channel is waited for itself.
			var ch *brokerChannel
			Eventually(func() *brokerChannel { ch = d.current.Load(); return ch }, drainTimeout, 5*time.Millisecond).
				ShouldNot(Or(BeNil(), BeIdenticalTo(closed)), "a new connection")
			before := db.Count(ctx, spec.Name, "published_at IS NOT NULL")
			Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout, 5*time.Millisecond).
				Should(BeNumerically(">=", before+500), "publishing on the new connection")
			ch.close()
			closed = ch
		}
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout, 100*time.Millisecond).Should(BeZero())
		Expect(db.Count(ctx, spec.Name, "attempts > 0")).To(BeZero())
	})
})

var _ = Describe("A channel that gave up a confirm while the broker blocked it", Label("integration"), func() {
	It("is replaced once the broker no longer blocks it, before anything else is published on it", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		d := startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
		Eventually(d.current.Load).ShouldNot(BeNil())
		stale := d.current.Load()
		stale.stale.Store(true) // as classify leaves it
		d.poke()
		Eventually(d.current.Load, drainTimeout).ShouldNot(BeIdenticalTo(stale))
		Expect(stale.healthy()).To(BeFalse(), "the stale channel is closed")
		db.Seed(ctx, spec.Name, 10)
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout).Should(Equal(10))
	})
})

var _ = Describe("Rows that would break the connection", Label("integration"), func() {
	It("publishes the other rows once each and poisons a row whose routing key is longer than AMQP allows, saying why", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		db.Seed(ctx, spec.Name, 999)
		db.Exec(ctx, "INSERT INTO "+spec.Name+" (event_type, payload) VALUES (repeat('a', 256), '{}')")
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.MaxAttempts, cfg.RetryInitial, cfg.RetryMax = 3, 10*time.Millisecond, 50*time.Millisecond
		startDrainer(ctx, cfg)

		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout).Should(Equal(999))
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL AND attempts >= 3") }, drainTimeout).Should(Equal(1),
			"the row is poisoned")
		Expect(lastErrorOf(ctx, spec.Name)).To(ContainSubstring("routing key is 256 bytes, over the AMQP limit of 255"))
		publishedOnce(ctx, spec.Name, topo.Queue)
	})

	It("counts an attempt for a row in flight through 3 consecutive broker connection failures, so it cannot stall the drainer", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		user := testenv.UniqueName("spillway_topic")
		rabbitmqctl("add_user", user, "secret")
		DeferCleanup(func() { rabbitmqctl("delete_user", user) })
		rabbitmqctl("set_permissions", user, ".*", ".*", ".*")
		// RabbitMQ refuses a publish to another routing key by closing the
		// channel: nothing the drainer can check before publishing.
		rabbitmqctl("set_topic_permissions", user, topo.Exchange, `^order\.`, `^order\.`)
		db.Seed(ctx, spec.Name, 50)
		db.Exec(ctx, "INSERT INTO "+spec.Name+" (event_type, payload) VALUES ('forbidden.key', '{}')")
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.Broker.URL = "amqp://" + user + ":secret@127.0.0.1:5672/"
		cfg.MaxAttempts = 1
		startDrainer(ctx, cfg)

		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL AND attempts >= 1") }, drainTimeout).Should(Equal(1),
			"the refused row is poisoned")
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout).Should(Equal(50))
		Expect(lastErrorOf(ctx, spec.Name)).To(And(ContainSubstring("3 consecutive broker connection failures"), ContainSubstring("ACCESS_REFUSED")))
	})
})

var _ = Describe("A broker that nacks", Label("integration"), func() {
	It("poisons nothing while a full queue rejects publishes for longer than maxAttempts claims, and publishes everything once it drains", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", amqp.Table{"x-max-length": 10, "x-overflow": "reject-publish"})
		db.Seed(ctx, spec.Name, 200)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.MaxAttempts, cfg.RetryInitial, cfg.RetryMax = 3, 100*time.Millisecond, 200*time.Millisecond
		d := startDrainer(ctx, cfg)

		ch := amqpChannel()
		Eventually(func() (int, error) { return testenv.QueueDepth(ch, topo.Queue) }, drainTimeout).Should(Equal(10), "the queue is full")
		claims := histogramCount(d.reg, "spillway_drainer_claim_duration_seconds")
		Eventually(func() uint64 { return histogramCount(d.reg, "spillway_drainer_claim_duration_seconds") }, drainTimeout).
			Should(BeNumerically(">=", claims+2*uint64(cfg.MaxAttempts)), "the drainer kept claiming into the full queue")
		Expect(db.Count(ctx, spec.Name, "attempts > 0")).To(BeZero(), "a nack counted an attempt")

		missing, duplicates := suite.Undelivered(ch, topo.Queue, db.IDs(ctx, spec.Name, "true"), drainTimeout)
		Expect(missing).To(BeEmpty(), "rows never published once the queue drained")
		GinkgoWriter.Printf("duplicates: %d\n", duplicates)
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		Expect(db.Count(ctx, spec.Name, "attempts > 0")).To(BeZero())
		Expect(testutil.ToFloat64(d.metrics.Released.WithLabelValues("nack"))).To(BeNumerically(">", 0), "nacks are counted")
	})
})

// lastErrorOf is the last_error of the only pending row of table.
func lastErrorOf(ctx context.Context, table string) string {
	var s string
	Expect(pool.QueryRow(ctx, "SELECT last_error FROM "+table+" WHERE published_at IS NULL").Scan(&s)).To(Succeed())
	return strings.TrimSpace(s)
}
