package e2e

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
)

// hooks is the namespace of the webhook fleet.
const hooks = "hooks"

var _ = Describe("A webhook fleet on the local cluster", func() {
	It("posts 20,000 events from two drainer pods to a receiver that verifies every signature, and shows the fleet draining to it", func(ctx SpecContext) {
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

		manifests, err := testenv.SampleWebhookFleet(receiver, table, "1s")
		Expect(err).NotTo(HaveOccurred())
		out, err := runWithInput(manifests, "kubectl", "apply", "--namespace", hooks, "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		labels := map[string]string{"app.kubernetes.io/component": "drainer", "app.kubernetes.io/instance": "orders-webhook"}
		Eventually(func() []string { return readyPods(ctx, hooks, labels) }, 2*time.Minute).Should(HaveLen(2))

		events := testenv.Outbox{DB: services.DB, Table: table}
		receiver.Answer = nil // 204 to every verified request
		ids, err := events.Insert(ctx, 20_000)
		Expect(err).NotTo(HaveOccurred())
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
		AddReportEntry("ledger", fmt.Sprintf("webhook fleet, 2 pods: 20000 events, %d lost, %d duplicates\n%s", len(lost), duplicates, shown))
	})
})
