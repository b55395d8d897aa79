package drainer

import (
	"context"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/drainer/webhook"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/telemetry"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

// tracedRow is a row as the trace specs wrote it: its kind, and the trace
// context it holds, in its columns or its headers.
type tracedRow struct {
	kind          string
	parent, state string
}

// seedTraced writes n rows of kind into table, each with a trace context of
// its own, a trace id and a parent id made from its number: in the trace
// columns (where "column"), in the headers ("header"), with a malformed
// traceparent ("bad-parent") or tracestate ("bad-state"), or none ("none").
func seedTraced(ctx context.Context, table, kind string, n int) {
	parent := `'00-' || md5(g || $1) || '-' || substr(md5(g || $1 || 'span'), 1, 16) || '-01'`
	columns := map[string][2]string{
		"column":     {"traceparent, tracestate, headers", parent + `, 'vendor=v' || g, NULL`},
		"header":     {"headers", `jsonb_build_object('tenant', 'acme', 'traceparent', ` + parent + `, 'tracestate', 'vendor=h' || g)`},
		"bad-parent": {"traceparent, tracestate, headers", `'00-not-a-trace', 'vendor=x', NULL`},
		"bad-state":  {"traceparent, tracestate, headers", parent + `, '=no key=', NULL`},
		"none":       {"headers", `NULL`},
	}[kind]
	db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, `+columns[0]+`)
		SELECT 'trace.' || $1, jsonb_build_object('kind', $1::text, 'n', g), `+columns[1]+`
		FROM generate_series(1, $2::int) g`, kind, n)
}

// tracedRows are table's rows by id, with the trace context each holds.
func tracedRows(ctx context.Context, table string) map[string]tracedRow {
	rows, err := pool.Query(ctx, `SELECT id::text, payload->>'kind', coalesce(traceparent, headers->>'traceparent', ''),
		coalesce(tracestate, headers->>'tracestate', '') FROM `+table)
	Expect(err).NotTo(HaveOccurred())
	byID := map[string]tracedRow{}
	for rows.Next() {
		var id string
		var r tracedRow
		Expect(rows.Scan(&id, &r.kind, &r.parent, &r.state)).To(Succeed())
		byID[id] = r
	}
	Expect(rows.Err()).NotTo(HaveOccurred())
	return byID
}

// header is a message header's value as text, "" when it has none.
func header(h amqp.Table, key string) string {
	v, _ := h[key].(string)
	return v
}

var _ = Describe("A row's trace context", Label(tier.DB, tier.Broker), func() {
	It("goes on in its message's headers, from its columns or its headers; a malformed one is dropped and counted, and the row published", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		kinds := map[string]int{"column": 40, "header": 40, "bad-parent": 10, "bad-state": 10, "none": 10}
		total := 0
		for kind, n := range kinds {
			seedTraced(ctx, spec.Name, kind, n)
			total += n
		}
		rows := tracedRows(ctx, spec.Name)
		d := startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
		got, err := testenv.Consume(amqpChannel(), topo.Queue, total, drainTimeout)
		Expect(err).NotTo(HaveOccurred())
		for _, m := range got {
			row, h := rows[m.MessageId], m.Headers
			switch row.kind {
			case "column", "header":
				Expect(header(h, "traceparent")).To(Equal(row.parent), row.kind)
				Expect(header(h, "tracestate")).To(Equal(row.state), row.kind)
			case "bad-state":
				Expect(header(h, "traceparent")).To(Equal(row.parent), "a good traceparent stays")
				Expect(h).NotTo(HaveKey("tracestate"))
			default:
				Expect(h).NotTo(HaveKey("traceparent"), row.kind)
				Expect(h).NotTo(HaveKey("tracestate"), row.kind)
			}
			if row.kind == "header" {
				Expect(header(h, "tenant")).To(Equal("acme"), "the other headers stay")
			}
		}
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL AND attempts = 0") }, drainTimeout).Should(Equal(total))
		Expect(testutil.ToFloat64(d.metrics.TraceDropped.WithLabelValues("traceparent"))).To(Equal(10.0))
		Expect(testutil.ToFloat64(d.metrics.TraceDropped.WithLabelValues("tracestate"))).To(Equal(10.0))
		Expect(string(d.logs.Contents())).To(ContainSubstring("Dropped a malformed trace context"))
	})

	It("goes on in a webhook's request as the traceparent and tracestate headers, never under the header prefix", func(ctx SpecContext) {
		receiver, err := testenv.StartReceiver(testenv.NewSecret())
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(receiver.Stop)
		var mu sync.Mutex
		seen := map[string]http.Header{}
		receiver.Answer = func(w http.ResponseWriter, r *http.Request, id string, _ int) bool {
			mu.Lock()
			seen[id] = r.Header.Clone()
			mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
			return true
		}
		spec := db.CanonicalOutbox(ctx)
		seedTraced(ctx, spec.Name, "column", 10)
		seedTraced(ctx, spec.Name, "header", 10)
		seedTraced(ctx, spec.Name, "none", 5)
		rows := tracedRows(ctx, spec.Name)
		secrets, err := testenv.WriteSecrets(GinkgoT().TempDir(), receiver.Secret)
		Expect(err).NotTo(HaveOccurred())
		cfg := testConfig("webhook-drainer", spec, "")
		wh := webhook.DefaultConfig()
		wh.URL, wh.AllowHTTP, wh.SigningSecretFile = receiver.URL(), true, secrets
		cfg.Webhook = &wh
		startDrainer(ctx, cfg)
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout).Should(Equal(25))
		mu.Lock()
		defer mu.Unlock()
		Expect(seen).To(HaveLen(25))
		for id, h := range seen {
			row := rows[id]
			Expect(h.Get("Traceparent")).To(Equal(row.parent), row.kind)
			Expect(h.Get("Tracestate")).To(Equal(row.state), row.kind)
			Expect(h.Get("X-Outbox-Traceparent")).To(BeEmpty())
			if row.kind == "header" {
				Expect(h.Get("X-Outbox-Tenant")).To(Equal("acme"))
			}
		}
	})
})

var _ = Describe("Tracing a drain through OTLP", Label(tier.DB, tier.Broker), func() {
	It("exports a claim and a settle span, and a publish span per message under its row's trace, whose context the message carries", func(ctx SpecContext) {
		collector, err := testenv.StartCollector()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(collector.Stop)
		for k, v := range map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": collector.Endpoint(), "OTEL_RESOURCE_ATTRIBUTES": "spillway.fleet=orders"} {
			Expect(os.Setenv(k, v)).To(Succeed())
			DeferCleanup(os.Unsetenv, k)
		}
		tp, shutdown, err := telemetry.Start(ctx, "spillway-drainer")
		Expect(err).NotTo(HaveOccurred())
		Expect(tp).NotTo(BeNil())
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		seedTraced(ctx, spec.Name, "column", 30)
		seedTraced(ctx, spec.Name, "header", 10)
		seedTraced(ctx, spec.Name, "none", 5)
		rows := tracedRows(ctx, spec.Name)
		cfg := testConfig("drainer-traced", spec, topo.Exchange)
		cfg.Tracing = tp
		d := startDrainer(ctx, cfg)
		got, err := testenv.Consume(amqpChannel(), topo.Queue, len(rows), drainTimeout)
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout).Should(Equal(len(rows)))
		// Every span has ended once the drainer has stopped, and the
		// provider's shutdown exports what its batcher still holds.
		d.stop()
		Eventually(d.exited, 30*time.Second).Should(BeClosed())
		Expect(shutdown(context.Background())).To(Succeed())
		Expect(collector.Errors()).To(BeEmpty())

		spans := collector.Spans()
		publishes, claims, settles := map[string]testenv.Span{}, map[string]bool{}, 0
		for _, s := range spans {
			Expect(s.Resource).To(HaveKeyWithValue("service.name", "spillway-drainer"))
			Expect(s.Resource).To(HaveKeyWithValue("spillway.fleet", "orders"))
			switch s.Name {
			case "publish " + topo.Exchange:
				publishes[s.Attributes["messaging.message.id"]] = s
			case "claim " + spec.Name:
				Expect(s.Attributes).To(HaveKeyWithValue("db.system.name", "postgresql"))
				claims[s.SpanID] = true
			case "settle " + spec.Name:
				settles++
			}
		}
		Expect(claims).NotTo(BeEmpty())
		Expect(settles).To(BeNumerically(">", 0))
		Expect(publishes).To(HaveLen(len(rows)), "a publish span per message")
		for _, m := range got {
			row, span := rows[m.MessageId], publishes[m.MessageId]
			Expect(span.Kind).To(Equal(tracepb.Span_SPAN_KIND_PRODUCER))
			Expect(span.Attributes).To(And(
				HaveKeyWithValue("messaging.system", "rabbitmq"),
				HaveKeyWithValue("messaging.operation.type", "send"),
				HaveKeyWithValue("messaging.destination.name", topo.Exchange),
				HaveKeyWithValue("messaging.rabbitmq.destination.routing_key", "trace."+row.kind)))
			if row.kind == "none" {
				Expect(claims).To(HaveKey(span.ParentSpanID), "an untraced row's publish is its claim's child")
				Expect(m.Headers).NotTo(HaveKey("traceparent"))
				continue
			}
			// 00-<trace id>-<parent id>-01
			Expect(span.TraceID).To(Equal(row.parent[3:35]), "the row's trace")
			Expect(span.ParentSpanID).To(Equal(row.parent[36:52]), "the row's span as parent")
			Expect(span.Links).To(ContainElement(BeKeyOf(claims)), "a link to its claim")
			Expect(header(m.Headers, "traceparent")).To(Equal("00-"+span.TraceID+"-"+span.SpanID+"-01"), "the consumer continues below the publish")
			Expect(header(m.Headers, "tracestate")).To(Equal(row.state))
		}
	})
})

var _ = Describe("Reading a row's trace context", func() {
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	column := func(s string) *string { return &s }
	DescribeTable("keeps what is well-formed and names what it drops",
		func(row outbox.Row, want sink.Trace, dropped []string) {
			sc, gone := rowTrace(row)
			Expect(traceHeaders(sc)).To(Equal(want))
			Expect(gone).To(Equal(dropped))
		},
		Entry("the columns", outbox.Row{TraceParent: column(parent), TraceState: column("v=1")}, sink.Trace{Parent: parent, State: "v=1"}, nil),
		Entry("the columns before the headers", outbox.Row{TraceParent: column(parent), Headers: []byte(`{"traceparent":"junk"}`)}, sink.Trace{Parent: parent}, nil),
		Entry("the headers' keys", outbox.Row{Headers: []byte(`{"traceparent":"` + parent + `","tracestate":"v=1"}`)}, sink.Trace{Parent: parent, State: "v=1"}, nil),
		Entry("none", outbox.Row{Headers: []byte(`{"tenant":"acme"}`)}, sink.Trace{}, nil),
		Entry("upper-case hex", outbox.Row{TraceParent: column(strings.ToUpper(parent))}, sink.Trace{}, []string{"traceparent"}),
		Entry("an all-zero trace id", outbox.Row{TraceParent: column("00-00000000000000000000000000000000-b7ad6b7169203331-01")}, sink.Trace{}, []string{"traceparent"}),
		Entry("a number for a traceparent", outbox.Row{Headers: []byte(`{"traceparent":42}`)}, sink.Trace{}, []string{"traceparent"}),
		Entry("a bad tracestate beside a good traceparent", outbox.Row{TraceParent: column(parent), TraceState: column("=x=")}, sink.Trace{Parent: parent}, []string{"tracestate"}),
		Entry("a tracestate that is not a string", outbox.Row{Headers: []byte(`{"traceparent":"` + parent + `","tracestate":{"a":1}}`)}, sink.Trace{Parent: parent}, []string{"tracestate"}),
	)
})
