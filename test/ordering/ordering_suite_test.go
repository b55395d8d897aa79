// Package ordering proves per-key ordering as a property of a running fleet:
// spillway drain processes against the local Postgres and RabbitMQ, with
// nacks and row faults injected at random and a drainer killed mid-run,
// and the queue read back in order.
package ordering

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

func TestOrdering(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Ordering Suite: per-key ordering across processes", Label(tier.Process))
}

var (
	spillway string
	pool     *pgxpool.Pool
	amqpConn *amqp.Connection
)

var _ = BeforeSuite(func(ctx SpecContext) {
	spillway = suite.BuildSpillway()
	services, err := testenv.Connect(ctx)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(services.Close)
	pool, amqpConn = services.DB, services.Broker
})

// delivery is one message as the consumer saw it, in queue order.
type delivery struct {
	id  string
	key string
	seq int
}

// recorder consumes a queue and keeps every delivery in arrival order.
type recorder struct {
	mu   sync.Mutex
	seen []delivery
	ids  map[string]bool
	err  error
}

func record(ch *amqp.Channel, queue string) *recorder {
	Expect(ch.Qos(1000, 0, false)).To(Succeed())
	msgs, err := ch.Consume(queue, "", false, true, false, false, nil)
	Expect(err).NotTo(HaveOccurred())
	r := &recorder{ids: map[string]bool{}}
	go func() {
		for d := range msgs {
			var body struct {
				Key string `json:"key"`
				Seq int    `json:"seq"`
			}
			err := json.Unmarshal(d.Body, &body)
			r.mu.Lock()
			if err != nil && r.err == nil {
				r.err = fmt.Errorf("message %s: %w", d.MessageId, err)
			}
			r.seen = append(r.seen, delivery{id: d.MessageId, key: body.Key, seq: body.Seq})
			r.ids[d.MessageId] = true
			r.mu.Unlock()
			_ = d.Ack(false)
		}
	}()
	return r
}

func (r *recorder) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// verdict reads the deliveries back: for each key, the first delivery of
// each event must come in enqueue order (seq 1, 2, 3, … of that key);
// later deliveries are duplicates, which at-least-once allows.
func (r *recorder) verdict(perKey map[string]int) (lost, duplicates, reordered int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := map[string]bool{}
	next := map[string]int{}
	for _, d := range r.seen {
		if first[d.id] {
			duplicates++
			continue
		}
		first[d.id] = true
		if d.seq != next[d.key]+1 {
			reordered++
			GinkgoWriter.Printf("reordered: key %s delivered seq %d first, after seq %d\n", d.key, d.seq, next[d.key])
		}
		next[d.key] = max(next[d.key], d.seq)
	}
	for _, n := range perKey {
		lost += n
	}
	return lost - len(first), duplicates, reordered
}

// flap binds and unbinds queue to exchange under key every period, until
// ctx ends, so that rows published while it is bound (or unbound) fail. It
// has a channel of its own: two goroutines' calls on one channel can take
// each other's replies.
func flap(ctx context.Context, queue, key, exchange string, period time.Duration, bound bool) {
	ch, err := amqpConn.Channel()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = ch.Close() })
	go func() {
		defer GinkgoRecover()
		for {
			var err error
			if bound {
				err = ch.QueueBind(queue, key, exchange, false, nil)
			} else {
				err = ch.QueueUnbind(queue, key, exchange, nil)
			}
			if ctx.Err() != nil {
				return
			}
			Expect(err).NotTo(HaveOccurred())
			bound = !bound
			select {
			case <-ctx.Done():
				return
			case <-time.After(period):
			}
		}
	}()
}

var _ = Describe("A fleet ordering per key", func() {
	It("delivers every event, the first delivery of each in its key's enqueue order, through nacks, row faults and a SIGKILL", func(ctx SpecContext) {
		const events, keys = 50_000, 1_000
		table := suite.Migrate(spillway, pool, "ordered_outbox")
		_, err := pool.Exec(ctx, "ALTER TABLE "+table+" ADD COLUMN aggregate_id text")
		Expect(err).NotTo(HaveOccurred())
		migrate := suite.Start(spillway, "migrate", "--database-url", testenv.DatabaseURL(), "--table", table, "--ordering-key-column", "aggregate_id")
		Eventually(migrate, 60*time.Second).Should(gexec.Exit(0))

		// Topology: events go to ev.<key>; 2% to ev.flaky.<key>, which a
		// full reject-publish queue nacks while it is bound; 2% to
		// rf.<key>, which no queue takes while unbound, so that a mandatory
		// publish is returned: a row fault, counting an attempt.
		ch, err := amqpConn.Channel()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = ch.Close() })
		topo, err := testenv.DeclareTopology(ch, "ev.#", nil)
		Expect(err).NotTo(HaveOccurred())
		full := testenv.UniqueName("spillway_full")
		_, err = ch.QueueDeclare(full, false, true, false, false, amqp.Table{"x-max-length": 0, "x-overflow": "reject-publish"})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			ch, err := amqpConn.Channel()
			if err == nil {
				_, _ = ch.QueueDelete(full, false, false, false)
				topo.Delete(ch)
				_ = ch.Close()
			}
		})

		// Keys at random; each key's rows numbered in enqueue order, one
		// microsecond apart, so enqueue order is unambiguous.
		_, err = pool.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, aggregate_id, enqueued_at, available_at)
			SELECT CASE WHEN r < 0.02 THEN 'ev.flaky.' WHEN r < 0.04 THEN 'rf.' ELSE 'ev.' END || key,
				jsonb_build_object('key', key, 'seq', row_number() OVER (PARTITION BY key ORDER BY g)), key,
				now() - interval '1 hour' + g * interval '1 microsecond', now() - interval '1 hour' + g * interval '1 microsecond'
			FROM (SELECT g, 'k' || floor(random() * $2)::int AS key, random() AS r FROM generate_series(1, $1::int) g) s`, events, keys)
		Expect(err).NotTo(HaveOccurred())
		perKey := map[string]int{}
		rows, err := pool.Query(ctx, "SELECT aggregate_id, count(*) FROM "+table+" GROUP BY 1")
		Expect(err).NotTo(HaveOccurred())
		for rows.Next() {
			var key string
			var n int
			Expect(rows.Scan(&key, &n)).To(Succeed())
			perKey[key] = n
		}
		Expect(rows.Err()).NotTo(HaveOccurred())
		faults := map[string]int{}
		for _, kind := range []string{"ev.flaky.%", "rf.%"} {
			var n int
			Expect(pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE event_type LIKE $1", kind).Scan(&n)).To(Succeed())
			faults[kind] = n
		}

		consumer, err := amqpConn.Channel()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = consumer.Close() })
		rec := record(consumer, topo.Queue)

		flapping, stop := context.WithCancel(context.Background())
		DeferCleanup(stop)
		flap(flapping, full, "ev.flaky.#", topo.Exchange, 300*time.Millisecond, true)
		flap(flapping, topo.Queue, "rf.#", topo.Exchange, 300*time.Millisecond, false)

		// At most one row per key in flight, sampled while the fleet runs.
		var overlaps sync.Map
		go func() {
			defer GinkgoRecover()
			for flapping.Err() == nil {
				rows, err := pool.Query(flapping, `SELECT aggregate_id FROM `+table+`
					WHERE published_at IS NULL AND claimed_by IS NOT NULL AND available_at > now() GROUP BY 1 HAVING count(*) > 1`)
				if err == nil {
					for rows.Next() {
						var key string
						if rows.Scan(&key) == nil {
							overlaps.Store(key, true)
						}
					}
					rows.Close()
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()

		drain := func(id string) *gexec.Session {
			return suite.Start(spillway, "drain", "--drainer-id", id, "--metrics-addr", "",
				"--database-url", testenv.DatabaseURL(), "--broker-url", testenv.BrokerURL(),
				"--table", table, "--ordering-key-column", "aggregate_id", "--ordering-on-failure", "block",
				"--exchange", topo.Exchange, "--mandatory",
				"--batch-size", "100", "--pipeline-depth", "10", "--lease-ttl", "3s", "--poll-interval", "100ms",
				"--max-attempts", "1000", "--retry-initial", "20ms", "--retry-max", "200ms",
				// Kept, for the failed attempts counted once the drain is over.
				"--retention-published", "24h")
		}
		start := time.Now()
		victim := drain("ordered-1")
		drain("ordered-2")
		drain("ordered-3")

		published := func() int { return suite.DB{Pool: pool}.Count(ctx, table, "published_at IS NOT NULL") }
		Eventually(published, 2*time.Minute, 100*time.Millisecond).Should(BeNumerically(">=", events/3))
		victim.Kill() // SIGKILL: its claims stay until their lease ends
		Eventually(victim, 10*time.Second).Should(gexec.Exit())
		killedAt := published()

		Eventually(func() int { return suite.DB{Pool: pool}.Count(ctx, table, "published_at IS NULL") }, 3*time.Minute, 250*time.Millisecond).Should(BeZero())
		drained := time.Since(start)
		Eventually(rec.distinct, 30*time.Second, 100*time.Millisecond).Should(Equal(events), "every event reaches the queue")
		stop()

		lost, duplicates, reordered := rec.verdict(perKey)
		var keysOverlapping int
		overlaps.Range(func(any, any) bool { keysOverlapping++; return true })
		var failures int
		Expect(pool.QueryRow(ctx, "SELECT coalesce(sum(attempts), 0) FROM "+table).Scan(&failures)).To(Succeed())
		summary := fmt.Sprintf("%d events over %d keys by 3 drainers (one SIGKILLed at %d published), %d to ev.flaky (nacked while bound), %d to rf (returned while unbound), %d failed attempts counted, drained in %s: lost %d, duplicates %d, reordered first deliveries %d, keys seen with two rows in flight %d",
			events, len(perKey), killedAt, faults["ev.flaky.%"], faults["rf.%"], failures, drained.Round(100*time.Millisecond), lost, duplicates, reordered, keysOverlapping)
		GinkgoWriter.Println(summary)
		AddReportEntry("ordering property", summary)
		Expect(rec.err).NotTo(HaveOccurred())
		Expect(lost).To(BeZero())
		Expect(reordered).To(BeZero())
		Expect(keysOverlapping).To(BeZero())
		Expect(failures).To(BeNumerically(">", 0), "row faults were injected and counted")
	})
})
