package drainer

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/drainer/rabbitmq"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

const drainTimeout = 60 * time.Second

var _ = Describe("Draining", Label(tier.DB, tier.Broker), func() {
	It("publishes every row of a 10,000-row outbox exactly once with 3 concurrent drainers", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		db.Seed(ctx, spec.Name, 10_000)
		for _, id := range []string{"drainer-a", "drainer-b", "drainer-c"} {
			startDrainer(ctx, testConfig(id, spec, topo.Exchange))
		}

		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout, 100*time.Millisecond).Should(BeZero())
		Expect(db.Count(ctx, spec.Name, "true")).To(Equal(10_000))
		Expect(db.Count(ctx, spec.Name, "attempts > 0")).To(BeZero())
		var drainers int
		Expect(pool.QueryRow(ctx, "SELECT count(DISTINCT claimed_by) FROM "+spec.Name).Scan(&drainers)).To(Succeed())
		Expect(drainers).To(Equal(3), "all three drainers took part")

		ch := amqpChannel()
		Expect(testenv.QueueDepth(ch, topo.Queue)).To(Equal(10_000), "one message per row, no duplicates")
		msgs, err := testenv.Consume(ch, topo.Queue, 10_000, 30*time.Second)
		Expect(err).NotTo(HaveOccurred())
		seen := map[string]bool{}
		var twice, missing []string
		for _, m := range msgs {
			if seen[m.MessageId] {
				twice = append(twice, m.MessageId)
			}
			seen[m.MessageId] = true
		}
		for _, id := range db.IDs(ctx, spec.Name, "true") {
			if !seen[id] {
				missing = append(missing, id)
			}
		}
		Expect(twice).To(BeEmpty(), "rows published twice")
		Expect(missing).To(BeEmpty(), "rows never published")
	})

	It("deletes each row once its publish is confirmed when published rows are not kept, and publishes every row exactly once", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		db.Seed(ctx, spec.Name, 2_000)
		want := db.IDs(ctx, spec.Name, "true")
		// History published before the window became zero, and a row that
		// cannot be published: one goes, the other stays to be seen.
		db.Exec(ctx, "INSERT INTO "+spec.Name+" (event_type, payload, published_at) SELECT 'order.created', '{}', now() - interval '1 hour' FROM generate_series(1, 5)")
		db.Exec(ctx, "INSERT INTO "+spec.Name+" (event_type, payload) VALUES (repeat('k', 256), '{}')")
		for _, id := range []string{"drainer-a", "drainer-b"} {
			cfg := testConfig(id, spec, topo.Exchange)
			// The prune runs at start, for the history, and not again within
			// the spec: the settle deletes what the drainers publish.
			cfg.Retention = Retention{Published: new(time.Duration), Interval: time.Hour, BatchSize: 100}
			startDrainer(ctx, cfg)
		}

		// The bad row may be the last claim of the other drainer: wait for its
		// failure itself, not only for the good rows to be gone.
		Eventually(func(g Gomega) {
			g.Expect(db.Count(ctx, spec.Name, "true")).To(Equal(1))
			g.Expect(db.Count(ctx, spec.Name, "published_at IS NULL AND attempts > 0 AND last_error LIKE '%routing key%'")).To(Equal(1),
				"the row that cannot be published is kept, with its attempt and error")
		}, drainTimeout, 100*time.Millisecond).Should(Succeed())
		ch := amqpChannel()
		Expect(testenv.QueueDepth(ch, topo.Queue)).To(Equal(2_000), "one message per deleted row, no duplicates")
		msgs, err := testenv.Consume(ch, topo.Queue, 2_000, 30*time.Second)
		Expect(err).NotTo(HaveOccurred())
		var got []string
		for _, m := range msgs {
			got = append(got, m.MessageId)
		}
		Expect(got).To(ConsistOf(want), "every deleted row was published once")
	})

	It("by default deletes each row once its publish is confirmed, and leaves the rows an earlier setting kept", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		db.Seed(ctx, spec.Name, 1_000)
		want := db.IDs(ctx, spec.Name, "true")
		// History marked published by a release that kept it: an upgrade
		// to the default must not delete it.
		db.Exec(ctx, "INSERT INTO "+spec.Name+" (event_type, payload, published_at) SELECT 'order.created', '{}', now() - interval '1 hour' FROM generate_series(1, 5)")
		kept := db.IDs(ctx, spec.Name, "published_at IS NOT NULL")
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.Retention = DefaultConfig().Retention
		startDrainer(ctx, cfg)

		ch := amqpChannel()
		msgs, err := testenv.Consume(ch, topo.Queue, 1_000, drainTimeout)
		Expect(err).NotTo(HaveOccurred())
		var got []string
		for _, m := range msgs {
			got = append(got, m.MessageId)
		}
		Expect(got).To(ConsistOf(want), "every row was published once")
		// The last confirms may still be settling: wait for the deletes.
		Eventually(func() []string { return db.IDs(ctx, spec.Name, "true") }, drainTimeout, 50*time.Millisecond).
			Should(ConsistOf(kept), "the published rows are deleted, the history kept before is not")
		Expect(testenv.QueueDepth(ch, topo.Queue)).To(BeZero(), "no row was published twice")
	})

	It("publishes each message persistent, with the row id, routing key, headers, content type, timestamp, type and app_id", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("order.*", nil)
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, headers, enqueued_at)
			VALUES ('order.created', '{"order": 7}', '{"tenant": "acme", "version": 2}', '2026-01-02T03:04:05Z')`)
		startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))

		msgs, err := testenv.Consume(amqpChannel(), topo.Queue, 1, 10*time.Second)
		Expect(err).NotTo(HaveOccurred())
		m := msgs[0]
		Expect(m.MessageId).To(Equal(db.IDs(ctx, spec.Name, "true")[0]))
		Expect(m.RoutingKey).To(Equal("order.created"))
		Expect(m.DeliveryMode).To(Equal(amqp.Persistent))
		Expect(m.ContentType).To(Equal("application/json"))
		Expect(m.Type).To(Equal("order.created"), "the event type, for consumers that route without parsing")
		Expect(m.AppId).To(Equal("spillway"))
		Expect(m.Timestamp.UTC()).To(Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
		Expect(m.Headers).To(Equal(amqp.Table{"tenant": "acme", "version": int64(2)}))
		Expect(string(m.Body)).To(MatchJSON(`{"order": 7}`))
	})

	It("with compact properties, publishes the row id, routing key, headers and content type and nothing else", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("order.*", nil)
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, headers) VALUES ('order.created', '{"order": 7}', '{"tenant": "acme"}')`)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.Broker.MessageProperties = rabbitmq.CompactProperties
		startDrainer(ctx, cfg)

		msgs, err := testenv.Consume(amqpChannel(), topo.Queue, 1, 10*time.Second)
		Expect(err).NotTo(HaveOccurred())
		m := msgs[0]
		Expect(m.MessageId).To(Equal(db.IDs(ctx, spec.Name, "true")[0]))
		Expect(m.RoutingKey).To(Equal("order.created"))
		Expect(m.DeliveryMode).To(Equal(amqp.Persistent))
		Expect(m.ContentType).To(Equal("application/json"))
		Expect(m.Headers).To(Equal(amqp.Table{"tenant": "acme"}))
		Expect(m.Timestamp.IsZero()).To(BeTrue())
		Expect(m.Type).To(BeEmpty())
		Expect(m.AppId).To(BeEmpty())
	})
})

var _ = Describe("Leases", Label(tier.DB, tier.Broker), func() {
	var (
		spec  outbox.TableSpec
		store *outbox.Store
	)
	claim := func(ctx context.Context, id string, n int) outbox.Claimed {
		c, err := store.Claim(ctx, suite.ClaimParams(id, n))
		Expect(err).NotTo(HaveOccurred())
		return c
	}
	idsOf := func(c outbox.Claimed) []string {
		var out []string
		for _, r := range c.Rows {
			out = append(out, r.ID)
		}
		return out
	}
	// backdate ends the leases of rows: a claimed row is due again when its
	// lease ends.
	backdate := func(ctx context.Context, rowIDs []string) {
		db.Exec(ctx, "UPDATE "+spec.Name+" SET claimed_at = now() - interval '31 seconds', available_at = now() - interval '1 second' WHERE id = ANY($1::uuid[])", rowIDs)
	}

	BeforeEach(func(ctx SpecContext) {
		spec = db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 10)
		var err error
		store, err = outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
	})

	It("re-claims rows whose lease expired and leaves rows with a live lease alone", func(ctx SpecContext) {
		held := claim(ctx, "drainer-a", 10)
		Expect(held.Rows).To(HaveLen(10))
		Expect(claim(ctx, "drainer-b", 10).Rows).To(BeEmpty(), "every lease is live")

		expired := idsOf(held)[:4]
		backdate(ctx, expired)
		Expect(idsOf(claim(ctx, "drainer-b", 10))).To(ConsistOf(expired))
		Expect(db.Count(ctx, spec.Name, "claimed_by = 'drainer-a'")).To(Equal(6))
	})

	It("lets a drainer whose rows were re-claimed mark nothing, report it, and keep running", func(ctx SpecContext) {
		topo := topology("#", nil)
		a := newDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
		held := claim(ctx, "drainer-a", 10)
		backdate(ctx, idsOf(held))
		Expect(claim(ctx, "drainer-b", 10).Rows).To(HaveLen(10))

		// drainer-a's confirms came back after its lease had expired.
		b := &batch{claim: held, outcomes: make([]outcome, len(held.Rows))}
		a.settle(ctx, []*batch{b})
		Expect(testutil.ToFloat64(a.metrics.LeaseLost)).To(Equal(10.0))
		Expect(testutil.ToFloat64(a.metrics.Published)).To(BeZero())
		Expect(db.Count(ctx, spec.Name, "published_at IS NULL AND claimed_by = 'drainer-b'")).To(Equal(10))

		a.start()
		db.Exec(ctx, "INSERT INTO "+spec.Name+" (event_type, payload) VALUES ('order.created', '{}')")
		Eventually(func() int {
			return db.Count(ctx, spec.Name, "published_at IS NOT NULL AND claimed_by = 'drainer-a'")
		}, drainTimeout).Should(Equal(1))
	})

	It("releases, on start, the claims a previous process left under the same drainer ID", func(ctx SpecContext) {
		topo := topology("#", nil)
		mine := idsOf(claim(ctx, "drainer-a", 5))
		theirs := idsOf(claim(ctx, "drainer-b", 5))

		startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
		Eventually(func() int {
			return db.Count(ctx, spec.Name, "published_at IS NOT NULL AND id = ANY($1::uuid[])", mine)
		}, drainTimeout).Should(Equal(5))
		Consistently(func() int {
			return db.Count(ctx, spec.Name, "published_at IS NULL AND claimed_by = 'drainer-b' AND id = ANY($1::uuid[])", theirs)
		}, time.Second).Should(Equal(5), "another drainer's live leases are not touched")
	})
})

var _ = Describe("Failures", Label(tier.DB, tier.Broker), func() {
	It("releases the whole batch without counting attempts when the exchange disappears mid-drain", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		d := startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
		db.Seed(ctx, spec.Name, 10)
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())

		Expect(amqpChannel().ExchangeDelete(topo.Exchange, false, false)).To(Succeed())
		db.Exec(ctx, "TRUNCATE "+spec.Name)
		db.Seed(ctx, spec.Name, 200)
		Eventually(func() float64 {
			return testutil.ToFloat64(d.metrics.Released.WithLabelValues(releaseConfirmLost)) +
				testutil.ToFloat64(d.metrics.Released.WithLabelValues(releaseBrokerUnavailable))
		}, drainTimeout).Should(BeNumerically(">", 0), "the channel closed with 404 and the claims were released")
		// A batch claimed ahead is released as soon as its publish fails.
		Eventually(func() int { return db.Count(ctx, spec.Name, "claimed_by IS NOT NULL") }, drainTimeout).Should(BeZero())
		Consistently(func() int {
			return db.Count(ctx, spec.Name, "claimed_by IS NOT NULL OR attempts > 0 OR published_at IS NOT NULL")
		}, 2*time.Second, 100*time.Millisecond).Should(BeZero(), "nothing claimed, bumped or published while the exchange is missing")

		ch := amqpChannel()
		Expect(ch.ExchangeDeclare(topo.Exchange, "topic", true, false, false, false, nil)).To(Succeed())
		Expect(ch.QueueBind(topo.Queue, "#", topo.Exchange, false, nil)).To(Succeed())
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		Expect(db.Count(ctx, spec.Name, "attempts > 0")).To(BeZero())
	})

	It("claims nothing while the broker is unreachable", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 20)
		cfg := testConfig("drainer-a", spec, "amq.topic")
		cfg.Broker.URL = "amqp://guest:guest@127.0.0.1:1/"
		d := startDrainer(ctx, cfg)
		// From its first failed dial on, the drainer is in the loop the
		// window below watches.
		Eventually(d.logs, drainTimeout).Should(gbytes.Say("Broker unavailable; claiming paused"))
		Consistently(func() int {
			return db.Count(ctx, spec.Name, "claimed_by IS NOT NULL OR attempts > 0")
		}, 2*time.Second, 100*time.Millisecond).Should(BeZero())
	})

	Describe("of a single row", func() {
		var spec outbox.TableSpec
		BeforeEach(func(ctx SpecContext) { spec = db.CanonicalOutbox(ctx) })

		// failedRow waits for the row's first failure and returns its last_error
		// and backoff, as the database sees them.
		failedRow := func(ctx context.Context) (lastError string, backoff time.Duration) {
			Eventually(func() int { return db.Count(ctx, spec.Name, "attempts = 1") }, drainTimeout).Should(Equal(1))
			var secs float64
			Expect(pool.QueryRow(ctx, `SELECT last_error, extract(epoch FROM available_at - now())
				FROM `+spec.Name+` WHERE claimed_by IS NULL AND published_at IS NULL`).Scan(&lastError, &secs)).To(Succeed())
			return lastError, time.Duration(secs * float64(time.Second))
		}

		It("counts an attempt, stores the reason and backs off when mandatory is on and the message is unroutable", func(ctx SpecContext) {
			topo := topology("nothing.matches", nil)
			db.Seed(ctx, spec.Name, 1)
			cfg := testConfig("drainer-a", spec, topo.Exchange)
			cfg.Broker.Mandatory = true
			cfg.RetryInitial, cfg.RetryMax = time.Hour, 2*time.Hour
			startDrainer(ctx, cfg)
			lastError, backoff := failedRow(ctx)
			Expect(lastError).To(ContainSubstring("312 NO_ROUTE"))
			Expect(backoff).To(BeNumerically("~", time.Hour, time.Minute))
		})

		It("marks an unroutable message published when mandatory is off, the default", func(ctx SpecContext) {
			topo := topology("nothing.matches", nil)
			db.Seed(ctx, spec.Name, 1)
			startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
			Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL AND attempts = 0") }, drainTimeout).Should(Equal(1))
		})

		It("caps the exponential backoff", func(ctx SpecContext) {
			topo := topology("nothing.matches", nil)
			db.Seed(ctx, spec.Name, 1)
			db.Exec(ctx, "UPDATE "+spec.Name+" SET attempts = 3")
			cfg := testConfig("drainer-a", spec, topo.Exchange)
			cfg.Broker.Mandatory = true
			cfg.RetryInitial, cfg.RetryMax = time.Hour, 5*time.Hour // 1h × 2³ = 8h, capped at 5h
			startDrainer(ctx, cfg)
			Eventually(func() int { return db.Count(ctx, spec.Name, "attempts = 4") }, drainTimeout).Should(Equal(1))
			Expect(db.Count(ctx, spec.Name, "available_at BETWEEN now() + interval '4 hours 59 minutes' AND now() + interval '5 hours'")).To(Equal(1))
		})

		It("fails a row with malformed headers without publishing it", func(ctx SpecContext) {
			topo := topology("#", nil)
			db.Exec(ctx, "INSERT INTO "+spec.Name+` (event_type, payload, headers) VALUES ('order.created', '{}', '["not", "an object"]')`)
			startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
			lastError, _ := failedRow(ctx)
			Expect(lastError).To(ContainSubstring("headers: must be a JSON object"))
			Expect(testenv.QueueDepth(amqpChannel(), topo.Queue)).To(BeZero())
		})

		It("poisons a row at maxAttempts: it is never due again, until replayed", func(ctx SpecContext) {
			topo := topology("nothing.matches", nil)
			db.Seed(ctx, spec.Name, 1)
			db.Exec(ctx, "UPDATE "+spec.Name+" SET attempts = 2")
			cfg := testConfig("drainer-a", spec, topo.Exchange)
			cfg.Broker.Mandatory, cfg.MaxAttempts = true, 3
			startDrainer(ctx, cfg)
			Eventually(func() int {
				return db.Count(ctx, spec.Name, "attempts = 3 AND available_at = 'infinity' AND claimed_by IS NULL")
			}, drainTimeout).
				Should(Equal(1))
		})

		It("fails an oversized row without loading its payload", func(ctx SpecContext) {
			topo := topology("#", nil)
			db.Exec(ctx, "INSERT INTO "+spec.Name+` (event_type, payload) VALUES ('order.created', jsonb_build_object('pad', repeat('x', 500)))`)
			cfg := testConfig("drainer-a", spec, topo.Exchange)
			cfg.MaxPayloadBytes = 100
			startDrainer(ctx, cfg)
			lastError, _ := failedRow(ctx)
			Expect(lastError).To(MatchRegexp(`payload is \d+ bytes, over the 100-byte limit`))
		})
	})

	It("never claims poisoned rows", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		db.Seed(ctx, spec.Name, 20)
		poisoned := db.IDs(ctx, spec.Name, "true LIMIT 10")
		db.Exec(ctx, "UPDATE "+spec.Name+" SET attempts = 3 WHERE id = ANY($1::uuid[])", poisoned)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.MaxAttempts = 3
		startDrainer(ctx, cfg)

		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout).Should(Equal(10))
		Consistently(func() int {
			return db.Count(ctx, spec.Name, "claimed_by IS NULL AND published_at IS NULL AND id = ANY($1::uuid[])", poisoned)
		}, time.Second).Should(Equal(10))
	})
})

var _ = Describe("Spent rows", Label(tier.DB, tier.Broker), func() {
	It("never hold back rows inserted after the drainer started: 20,000 rows poisoned under an older maxAttempts, polled once a second", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx) // no notify trigger: the poll finds the rows
		topo := topology("#", nil)
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at, available_at, attempts, last_error)
			SELECT 'order.created', jsonb_build_object('spent', g), now() - interval '1 day', now() - interval '1 day', 3 + g % 7, 'returned'
			FROM generate_series(1, 20000) g`)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.MaxAttempts, cfg.BatchSize, cfg.PollInterval = 3, 100, time.Second
		d := startDrainer(ctx, cfg)
		// Two claims find nothing live: the drainer idles between polls.
		Eventually(func() uint64 { return histogramCount(d.reg, "spillway_drainer_claim_duration_seconds") }, drainTimeout).Should(BeNumerically(">=", 2))

		ledger := startLedger(topo.Queue)

		claims := func() uint64 { return histogramCount(d.reg, "spillway_drainer_claim_duration_seconds") }
		db.Seed(ctx, spec.Name, 200)
		inserted, claimsBefore, live := time.Now(), claims(), db.IDs(ctx, spec.Name, "NOT payload ? 'spent'")
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout, 20*time.Millisecond).Should(Equal(200))
		GinkgoWriter.Printf("200 rows inserted behind 20,000 spent rows were published in %s, by %d claims\n",
			time.Since(inserted).Round(time.Millisecond), claims()-claimsBefore)
		// Two claims of 100 and one that finds nothing more, and the poll
		// that may fall between the insert and the first; not 200 polls.
		Expect(claims() - claimsBefore).To(BeNumerically("<=", 5))
		Eventually(ledger.Missing).WithArguments(live).Should(BeZero())
		lost, duplicates := ledger.Account(live)
		Expect(lost).To(BeEmpty())
		Expect(duplicates).To(BeZero())

		Eventually(func() int { return db.Count(ctx, spec.Name, "available_at = 'infinity'") }, drainTimeout).Should(Equal(20_000), "shelved")
		Expect(testutil.ToFloat64(d.metrics.Shelved)).To(Equal(20_000.0))
		Expect(ledger.Total()).To(Equal(200), "no spent row was published")
	})
})
