package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
)

// hooks is the namespace of the webhook fleet.
const hooks = "hooks"

var _ = Describe("A webhook fleet on the local cluster", func() {
	It("posts 20,000 events from two drainer pods to a receiver that verifies every signature, traced, and shows the fleet draining to it", func(ctx SpecContext) {
		ensureOperator(ctx)
		namespace(ctx, hooks)
		DeferCleanup(deleteNamespace, hooks)
		table := "public." + testenv.UniqueName("webhook_outbox")
		_, err := outbox.Migrate(ctx, services.DB, outbox.TableSpec{Name: table})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			_, err := services.DB.Exec(ctx, "DROP TABLE IF EXISTS "+table)
			Expect(err).NotTo(HaveOccurred())
		})

		manifests, err := testenv.SampleWebhookFleet(receiver, collector, table, "1s")
		Expect(err).NotTo(HaveOccurred())
		out, err := runWithInput(manifests, "kubectl", "apply", "--namespace", hooks, "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		labels := map[string]string{"app.kubernetes.io/component": "drainer", "app.kubernetes.io/instance": "orders-webhook"}
		Eventually(func() []string { return readyPods(ctx, hooks, labels) }, 2*time.Minute).Should(HaveLen(2))

		// Each request's traceparent, by row id.
		var mu sync.Mutex
		traceparents := map[string]string{}
		receiver.Answer = func(w http.ResponseWriter, r *http.Request, id string, _ int) bool {
			mu.Lock()
			traceparents[id] = r.Header.Get("traceparent")
			mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
			return true
		}
		DeferCleanup(func() { receiver.Answer = nil })
		events := testenv.Outbox{DB: services.DB, Table: table}
		ids, err := events.Insert(ctx, 20_000)
		Expect(err).NotTo(HaveOccurred())
		// And 1,000 written inside traces of their own.
		rows, err := services.DB.Query(ctx, `INSERT INTO `+table+` (event_type, payload, traceparent)
			SELECT 'order.traced', jsonb_build_object('order', g), '00-' || md5(g || 'e2e') || '-' || substr(md5(g || 'e2e-span'), 1, 16) || '-01'
			FROM generate_series(1, 1000) g RETURNING id::text, traceparent`)
		Expect(err).NotTo(HaveOccurred())
		traced := map[string]string{}
		var id, parent string
		_, err = pgx.ForEachRow(rows, []any{&id, &parent}, func() error { traced[id] = parent; ids = append(ids, id); return nil })
		Expect(err).NotTo(HaveOccurred())
		Expect(traced).To(HaveLen(1000))

		Eventually(func() []string { lost, _ := receiver.Account(ids); return lost }, 2*time.Minute, 100*time.Millisecond).Should(BeEmpty())
		// The fleet shows the backlog drained, and its sink.
		var shown string
		Eventually(func() map[string]string {
			shown = mustRun("kubectl", "get", "outboxdrainers", "--namespace", hooks, "-o", "wide")
			rows := testenv.ParseTable(shown)
			if len(rows) != 1 {
				return nil
			}
			return rows[0]
		}, time.Minute, time.Second).Should(And(HaveKeyWithValue("NAME", "orders-webhook"), HaveKeyWithValue("READY", "True"),
			HaveKeyWithValue("REPLICAS", "2"), HaveKeyWithValue("BACKLOG", "0"), HaveKeyWithValue("SINK", "Webhook")))
		lost, duplicates := receiver.Account(ids)
		_, unverified, lastError := receiver.Requests()
		Expect(unverified).To(BeZero(), "every request verified: %s", lastError)

		// Each traced row's request continues its trace below its publish
		// span, which the pods exported, named after the fleet and the pod.
		publishes := func() map[string]testenv.Span {
			byTrace := map[string]testenv.Span{}
			for _, s := range collector.Spans() {
				if s.Name == "POST" && s.Resource["spillway.fleet"] == "orders-webhook" {
					byTrace[s.TraceID] = s
				}
			}
			return byTrace
		}
		// Untraced rows' publish spans are in their claims' traces: wait for
		// each traced row's own trace, not for a count of traces.
		var spans map[string]testenv.Span
		Eventually(func() []string {
			spans = publishes()
			var missing []string
			for _, parent := range traced {
				if _, ok := spans[parent[3:35]]; !ok {
					missing = append(missing, parent[3:35])
				}
			}
			return missing
		}, time.Minute, time.Second).Should(BeEmpty(), "a publish span in each traced row's trace")
		mu.Lock()
		defer mu.Unlock()
		for id, parent := range traced {
			traceID := parent[3:35]
			span, ok := spans[traceID]
			Expect(ok).To(BeTrue(), "a publish span in the row's trace %s", traceID)
			Expect(span.ParentSpanID).To(Equal(parent[36:52]))
			Expect(span.Resource).To(And(HaveKeyWithValue("k8s.namespace.name", hooks), HaveKeyWithValue("k8s.pod.name", HavePrefix("orders-webhook-"))))
			Expect(traceparents[id]).To(HavePrefix("00-"+traceID+"-"), "the request carries the row's trace")
			Expect(strings.TrimSuffix(traceparents[id][36:], "-01")).NotTo(Equal(parent[36:52]), "below the publish span, not the row's span")
		}
		AddReportEntry("ledger", fmt.Sprintf("webhook fleet, 2 pods: %d events (%d traced, each with its publish span in its trace), %d lost, %d duplicates\n%s",
			len(ids), len(traced), len(lost), duplicates, shown))
	})
})
