package drainer

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/drainer/webhook"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

// eventRow is a row as a CloudEvent should show it.
type eventRow struct {
	routingKey string
	payload    string
	enqueuedAt time.Time
}

// eventRows are table's rows by id.
func eventRows(ctx context.Context, table string) map[string]eventRow {
	rows, err := pool.Query(ctx, `SELECT id::text, event_type, payload::text, enqueued_at FROM `+table)
	Expect(err).NotTo(HaveOccurred())
	byID := map[string]eventRow{}
	for rows.Next() {
		var id string
		var r eventRow
		Expect(rows.Scan(&id, &r.routingKey, &r.payload, &r.enqueuedAt)).To(Succeed())
		byID[id] = r
	}
	Expect(rows.Err()).NotTo(HaveOccurred())
	return byID
}

// expectEvent checks every attribute of e, decoded by the CloudEvents SDK,
// against its row.
func expectEvent(e *event.Event, rows map[string]eventRow, source string) {
	Expect(e.Validate()).To(Succeed())
	row, ok := rows[e.ID()]
	Expect(ok).To(BeTrue(), "the event's id %s is a row's", e.ID())
	Expect(e.SpecVersion()).To(Equal("1.0"))
	Expect(e.Source()).To(Equal(source))
	Expect(e.Type()).To(Equal(row.routingKey))
	Expect(e.Time()).To(BeTemporally("==", row.enqueuedAt))
	Expect(e.DataContentType()).To(Equal("application/json"))
	Expect(e.Data()).To(MatchJSON(row.payload))
}

var _ = Describe("Rows as CloudEvents", Label(tier.DB, tier.Broker), func() {
	DescribeTable("reach a consumer built on the CloudEvents SDK with every attribute", func(ctx SpecContext, mode sink.FormatMode) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		db.Seed(ctx, spec.Name, 50)
		rows := eventRows(ctx, spec.Name)
		cfg := testConfig("drainer-events", spec, topo.Exchange)
		cfg.Format = sink.Format{Mode: mode}
		startDrainer(ctx, cfg)
		got, err := testenv.Consume(amqpChannel(), topo.Queue, len(rows), drainTimeout)
		Expect(err).NotTo(HaveOccurred())
		seen := map[string]bool{}
		for _, d := range got {
			e, err := testenv.AMQPEvent(d)
			Expect(err).NotTo(HaveOccurred())
			expectEvent(e, rows, "/spillway/"+spec.Name)
			Expect(d.MessageId).To(Equal(e.ID()))
			seen[e.ID()] = true
		}
		Expect(seen).To(HaveLen(len(rows)))
	},
		Entry("in binary mode, the attributes as cloudEvents_ headers", sink.CloudEventsBinary),
		Entry("in structured mode, each an application/cloudevents+json body", sink.CloudEventsStructured),
	)

	DescribeTable("reach a webhook receiver built on the CloudEvents SDK with every attribute", func(ctx SpecContext, mode sink.FormatMode, batchRows int) {
		receiver, err := testenv.StartReceiver(testenv.NewSecret())
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(receiver.Stop)
		var mu sync.Mutex
		var events []event.Event
		var decodeErrors []string
		receiver.Answer = func(w http.ResponseWriter, r *http.Request, _ string, _ int) bool {
			var got []event.Event
			var err error
			if batchRows > 0 {
				got, err = cehttp.NewEventsFromHTTPRequest(r)
			} else {
				var e *event.Event
				if e, err = cehttp.NewEventFromHTTPRequest(r); err == nil {
					got = []event.Event{*e}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				decodeErrors = append(decodeErrors, err.Error())
				http.Error(w, err.Error(), http.StatusBadRequest)
				return false
			}
			events = append(events, got...)
			w.WriteHeader(http.StatusNoContent)
			return true
		}
		spec := db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 30)
		rows := eventRows(ctx, spec.Name)
		secrets, err := testenv.WriteSecrets(GinkgoT().TempDir(), receiver.Secret)
		Expect(err).NotTo(HaveOccurred())
		cfg := testConfig("webhook-events", spec, "")
		wh := webhook.DefaultConfig()
		wh.URL, wh.AllowHTTP, wh.SigningSecretFile, wh.BatchRows = receiver.URL(), true, secrets, batchRows
		cfg.Webhook = &wh
		cfg.Format = sink.Format{Mode: mode, Source: "urn:shop:orders"}
		startDrainer(ctx, cfg)
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout).Should(Equal(len(rows)))
		mu.Lock()
		defer mu.Unlock()
		Expect(decodeErrors).To(BeEmpty())
		Expect(events).To(HaveLen(len(rows)))
		for i := range events {
			expectEvent(&events[i], rows, "urn:shop:orders")
		}
	},
		Entry("in binary mode, the attributes as ce- headers", sink.CloudEventsBinary, 0),
		Entry("in structured mode, each an application/cloudevents+json request", sink.CloudEventsStructured, 0),
		Entry("in batches, an application/cloudevents-batch+json array", sink.CloudEventsBinary, 10),
	)
})
