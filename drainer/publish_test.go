package drainer

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
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

var _ = Describe("Classifying a confirm", Label(tier.DB, tier.Broker), func() {

	It("keeps draining when its broker connection is closed under it again and again mid-drain", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		db.Seed(ctx, spec.Name, 20_000)
		d := startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
		var closed *openSink
		for range 5 {
			// Settles of rows confirmed on the closed channel also count,
			// so the new channel is waited for itself.
			var ch *openSink
			Eventually(func() *openSink { ch = d.current.Load(); return ch }, drainTimeout, 5*time.Millisecond).
				ShouldNot(Or(BeNil(), BeIdenticalTo(closed)), "a new connection")
			before := db.Count(ctx, spec.Name, "published_at IS NOT NULL")
			Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout, 5*time.Millisecond).
				Should(BeNumerically(">=", before+500), "publishing on the new connection")
			ch.Close()
			closed = ch
		}
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout, 100*time.Millisecond).Should(BeZero())
		Expect(db.Count(ctx, spec.Name, "attempts > 0")).To(BeZero())
	})
})

var _ = Describe("A channel that gave up a confirm while the broker blocked it", Label(tier.DB, tier.Broker), func() {
	It("is replaced once the broker no longer blocks it, before anything else is published on it", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		d := newDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
		dialer := &stalingDialer{Dialer: d.dialer}
		d.dialer = dialer
		d.start()
		Eventually(d.current.Load).ShouldNot(BeNil())
		stale := d.current.Load()
		dialer.last.stale.Store(true) // as a delivery given up while blocked leaves it
		d.poke()
		Eventually(d.current.Load, drainTimeout).ShouldNot(BeIdenticalTo(stale))
		Expect(stale.Healthy()).To(BeFalse(), "the stale channel is closed")
		db.Seed(ctx, spec.Name, 10)
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout).Should(Equal(10))
	})
})

var _ = Describe("Rows that would break the connection", Label(tier.DB, tier.Broker), func() {
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

var _ = Describe("A broker that nacks", Label(tier.DB, tier.Broker), func() {
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

// stalingDialer dials the real broker, and lets a spec make its last
// connection stale, as a delivery given up while the broker blocked it
// leaves one.
type stalingDialer struct {
	sink.Dialer
	last *stalingSink
}

type stalingSink struct {
	sink.Sink
	stale atomic.Bool
}

func (s *stalingSink) Stale() bool { return s.stale.Load() || s.Sink.Stale() }

func (d *stalingDialer) Dial(hardStop context.Context, changed func()) (sink.Sink, error) {
	s, err := d.Dialer.Dial(hardStop, changed)
	if err != nil {
		return nil, err
	}
	d.last = &stalingSink{Sink: s}
	return d.last, nil
}

// lastErrorOf is the last_error of the only pending row of table.
func lastErrorOf(ctx context.Context, table string) string {
	var s string
	Expect(pool.QueryRow(ctx, "SELECT last_error FROM "+table+" WHERE published_at IS NULL").Scan(&s)).To(Succeed())
	return strings.TrimSpace(s)
}
