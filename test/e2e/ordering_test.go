package e2e

import (
	"encoding/json"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	amqp "github.com/rabbitmq/amqp091-go"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
)

// ordered is the namespace of the per-key ordering fleet.
const ordered = "ordered"

// arrivals consumes a queue and keeps, per key, the seq of each event's
// first delivery in arrival order.
type arrivals struct {
	mu     sync.Mutex
	seen   map[string]bool
	perKey map[string][]int
	// unreadable counts the bodies that were not an event of a key.
	unreadable int
}

func consumeInOrder(ch *amqp.Channel, queue string) *arrivals {
	msgs, err := ch.Consume(queue, "", true, true, false, false, nil)
	Expect(err).NotTo(HaveOccurred())
	a := &arrivals{seen: map[string]bool{}, perKey: map[string][]int{}}
	go func() {
		for d := range msgs {
			var body struct {
				Key string `json:"key"`
				Seq int    `json:"seq"`
			}
			err := json.Unmarshal(d.Body, &body)
			a.mu.Lock()
			if err != nil || body.Key == "" {
				a.unreadable++
			}
			if !a.seen[d.MessageId] {
				a.seen[d.MessageId] = true
				a.perKey[body.Key] = append(a.perKey[body.Key], body.Seq)
			}
			a.mu.Unlock()
		}
	}()
	return a
}

func (a *arrivals) unreadableCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unreadable
}

// of is how many events of key came.
func (a *arrivals) of(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.perKey[key])
}

func (a *arrivals) distinct() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.seen)
}

// reordered counts the first deliveries that came after a later event of
// their key.
func (a *arrivals) reordered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, seqs := range a.perKey {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] < seqs[i-1] {
				n++
			}
		}
	}
	return n
}

var _ = Describe("Per-key ordering on the local cluster", Ordered, func() {
	const keys, perKey = 2_000, 10
	var (
		table  string
		events *arrivals
	)

	BeforeAll(func(ctx SpecContext) {
		ensureOperator(ctx)
		namespace(ctx, ordered)
		DeferCleanup(deleteNamespace, ordered)
		ch, err := services.Broker.Channel()
		Expect(err).NotTo(HaveOccurred())
		topology, err := testenv.DeclareTopology(ch, "#", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { topology.Delete(ch); ch.Close() })
		events = consumeInOrder(ch, topology.Queue)

		table = "public." + testenv.UniqueName("ordered_outbox")
		spec := outbox.TableSpec{Name: table}
		_, err = outbox.Migrate(ctx, services.DB, spec)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			_, err := services.DB.Exec(ctx, "DROP TABLE IF EXISTS "+table)
			Expect(err).NotTo(HaveOccurred())
		})
		_, err = services.DB.Exec(ctx, "ALTER TABLE "+table+" ADD COLUMN aggregate_id text")
		Expect(err).NotTo(HaveOccurred())
		spec.Ordering = outbox.Ordering{KeyColumn: "aggregate_id"}
		_, err = outbox.Migrate(ctx, services.DB, spec)
		Expect(err).NotTo(HaveOccurred())

		manifests, err := testenv.SampleFleet(table, topology.Exchange, "1s", func(spec map[string]any) {
			spec["replicas"] = int64(3)
			spec["ordering"] = map[string]any{"keyColumn": "aggregate_id", "onFailure": "block"}
		})
		Expect(err).NotTo(HaveOccurred())
		out, err := runWithInput(manifests, "kubectl", "apply", "--namespace", ordered, "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		Eventually(func() []string { return readyPods(ctx, ordered, drainerLabels) }, 2*time.Minute).Should(HaveLen(3))
	})

	It("drains 20,000 events over 2,000 keys with 3 drainer pods at once, each key's events in enqueue order, and shows a key a poisoned row blocks", func(ctx SpecContext) {
		// The blocked key's first event has a routing key over AMQP's 255
		// bytes and, as if it had failed nine times already, the sample's
		// tenth attempt poisons it: under block, the key's second event
		// waits for it.
		_, err := services.DB.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, aggregate_id, enqueued_at, available_at, attempts)
			VALUES ('order.' || repeat('x', 300), '{"key": "stuck", "seq": 1}', 'stuck', now() - interval '2 hours', now() - interval '2 hours', 9),
				('order.created', '{"key": "stuck", "seq": 2}', 'stuck', now() - interval '2 hours' + interval '1 second', now(), 0)`)
		Expect(err).NotTo(HaveOccurred())
		// Each event a microsecond after the one before, the keys interleaved.
		_, err = services.DB.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, aggregate_id, enqueued_at, available_at)
			SELECT 'order.created', jsonb_build_object('key', 'k' || mod(g, $1::int), 'seq', g / $1::int + 1), 'k' || mod(g, $1::int), at, at
			FROM (SELECT g, now() - interval '1 hour' + g * interval '1 microsecond' AS at FROM generate_series(0, $1::int * $2::int - 1) g) s`,
			keys, perKey)
		Expect(err).NotTo(HaveOccurred())

		Eventually(events.distinct, 3*time.Minute, time.Second).Should(Equal(keys*perKey), "every event of the free keys reaches the queue")
		Expect(events.reordered()).To(BeZero(), "no first delivery comes after a later event of its key")
		Expect(events.unreadableCount()).To(BeZero(), "every message is an event of a key")
		var drainers int
		Expect(services.DB.QueryRow(ctx, "SELECT count(DISTINCT claimed_by) FROM "+table+" WHERE published_at IS NOT NULL").Scan(&drainers)).To(Succeed())
		// More heads than a batch: the pods claim different keys at once.
		Expect(drainers).To(BeNumerically(">=", 2), "the keys flowed through more than one pod")

		Eventually(func(g Gomega) {
			rows := testenv.ParseTable(mustRun("kubectl", "get", "outboxdrainers", "-o", "wide", "--namespace", ordered))
			g.Expect(rows).To(HaveLen(1))
			g.Expect(rows[0]).To(And(HaveKeyWithValue("BLOCKED", "1"), HaveKeyWithValue("POISONED", "1")))
		}, time.Minute, time.Second).Should(Succeed())
		od := &v1alpha1.OutboxDrainer{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ordered, Name: fleetName}, od)).To(Succeed())
		Expect(od.Status.BlockedKeys).NotTo(BeNil())
		Expect(od.Status.BlockedKeys.OldestKey).To(Equal("stuck"))
		AddReportEntry("kubectl get outboxdrainers -o wide", mustRun("kubectl", "get", "outboxdrainers", "-o", "wide", "--namespace", ordered))
		Expect(events.of("stuck")).To(BeZero(), "the blocked key's second event waits for its poisoned first")
	})
})
