package e2e

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/test/testenv"
)

// replays is the namespace of the replay journey's fleet.
const replays = "replays"

// ensureOperator installs the chart as the journey does, unless the journey
// has: the two run in either order. What it installs, it uninstalls when
// the specs are done, so that the journey installs the chart afresh.
func ensureOperator(ctx context.Context) {
	if _, err := run("helm", "status", release, "--namespace", operatorNamespace); err == nil {
		return
	}
	namespace(ctx, operatorNamespace)
	mustRun("helm", append([]string{"install", release, chart, "--namespace", operatorNamespace, "--wait", "--timeout", "3m"}, helmImages()...)...)
	DeferCleanup(func(ctx SpecContext) {
		mustRun("helm", "uninstall", release, "--namespace", operatorNamespace, "--wait", "--timeout", "3m")
		deleteNamespace(ctx, operatorNamespace)
	})
}

// deleteNamespace deletes a namespace and waits until it is gone.
func deleteNamespace(ctx context.Context, name string) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	Expect(client.IgnoreNotFound(k8s.Delete(ctx, ns))).To(Succeed())
	Eventually(func() bool { return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(ns), ns)) }, 3*time.Minute).
		Should(BeTrue(), "namespace %s deleted", name)
}

// getOutboxReplays runs kubectl get outboxreplays, and parses its table.
func getOutboxReplays() (string, []map[string]string) {
	out := mustRun("kubectl", "get", "outboxreplays", "--namespace", replays)
	return out, testenv.ParseTable(out)
}

// replayManifest is an OutboxReplay as a user writes it to replay the rows
// a too-long routing key poisoned.
func replayManifest(name string, dryRun bool) string {
	dry := "false"
	if dryRun {
		dry = "true"
	}
	return `apiVersion: spillway.io/v1alpha1
kind: OutboxReplay
metadata:
  name: ` + name + `
spec:
  drainerRef: {name: orders}
  action: replay
  dryRun: ` + dry + `
  selector:
    lastErrorPattern: "routing key is % bytes, over the AMQP limit of 255%"
`
}

// outboxReplay reads an OutboxReplay of the replay namespace.
func outboxReplay(ctx context.Context, name string) *v1alpha1.OutboxReplay {
	r := &v1alpha1.OutboxReplay{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: replays, Name: name}, r)).To(Succeed())
	return r
}

var _ = Describe("Poisoned rows on the local cluster", Ordered, func() {
	var (
		outbox   testenv.Outbox
		topology testenv.Topology
		ledger   *testenv.Ledger
		// good are published at once; long have a routing key over AMQP's
		// 255 bytes, and are poisoned.
		good, long []string
	)

	BeforeAll(func(ctx SpecContext) {
		ensureOperator(ctx)
		namespace(ctx, replays)
		DeferCleanup(deleteNamespace, replays)
		ch, err := services.Broker.Channel()
		Expect(err).NotTo(HaveOccurred())
		topology, err = testenv.DeclareTopology(ch, "#", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { topology.Delete(ch); ch.Close() })
		ledger, err = testenv.StartLedger(services.Broker, topology.Queue)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(ledger.Stop)
		outbox = testenv.Outbox{DB: services.DB, Table: "public." + testenv.UniqueName("replay_outbox")}
		err = outbox.Migrate(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			_, err := services.DB.Exec(ctx, "DROP TABLE IF EXISTS "+outbox.Table)
			Expect(err).NotTo(HaveOccurred())
		})
		out, err := runWithInput(sampleManifests(outbox.Table, topology.Exchange), "kubectl", "apply", "--namespace", replays, "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		Eventually(func() []string { return readyPods(ctx, replays, drainerLabels) }, 2*time.Minute).Should(HaveLen(2))
	})

	It("poisons 100 rows whose routing key is over 255 bytes, and kubectl get outboxdrainers shows them, with why in status.poisonedBy", func(ctx SpecContext) {
		var err error
		good, err = outbox.Insert(ctx, 200)
		Expect(err).NotTo(HaveOccurred())
		// As if they had failed nine times already (back-dated, not waited
		// for through the backoff): the sample's tenth attempt, the
		// drainer's own, poisons them.
		rows, err := services.DB.Query(ctx, `INSERT INTO `+outbox.Table+` (event_type, payload, attempts)
			SELECT 'order.' || repeat('x', 300), jsonb_build_object('order', g), 9 FROM generate_series(1, 100) g RETURNING id::text`)
		Expect(err).NotTo(HaveOccurred())
		long, err = pgx.CollectRows(rows, pgx.RowTo[string])
		Expect(err).NotTo(HaveOccurred())

		Eventually(func() (int, error) { return ledger.Missing(good) }, time.Minute).Should(BeZero())
		Eventually(func(g Gomega) {
			_, rows := getOutboxDrainers(replays)
			g.Expect(rows).To(HaveLen(1))
			g.Expect(rows[0]["POISONED"]).To(Equal("100"))
			g.Expect(rows[0]["BACKLOG"]).To(Equal("0"))
		}, time.Minute, time.Second).Should(Succeed())
		od := &v1alpha1.OutboxDrainer{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: replays, Name: fleetName}, od)).To(Succeed())
		Expect(od.Status.PoisonedBy).To(HaveLen(1))
		cause := od.Status.PoisonedBy[0]
		Expect(cause.Count).To(Equal(int64(100)))
		Expect(cause.LastError).To(HavePrefix("routing key is 306 bytes, over the AMQP limit of 255: order.xxx"))
		Expect(cause.OldestEnqueuedAt).NotTo(BeNil())
		Expect(mustRun("kubectl", "describe", "outboxdrainer", fleetName, "--namespace", replays)).To(ContainSubstring("Poisoned By:"))
	})

	It("replays them with an OutboxReplay once their key is fixed, after a dry run: they are published, and no other row again", func(ctx SpecContext) {
		_, err := services.DB.Exec(ctx, "UPDATE "+outbox.Table+" SET event_type = 'order.shipped' WHERE id::text = ANY($1)", long)
		Expect(err).NotTo(HaveOccurred())

		out, err := runWithInput(replayManifest("long-keys-dry-run", true), "kubectl", "apply", "--namespace", replays, "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		Eventually(func(g Gomega) map[string]string {
			_, rows := getOutboxReplays()
			g.Expect(rows).To(HaveLen(1))
			return rows[0]
		}, time.Minute, time.Second).Should(And(HaveKeyWithValue("COMPLETE", "True"), HaveKeyWithValue("MATCHED", "100"),
			HaveKeyWithValue("CHANGED", "0"), HaveKeyWithValue("DRYRUN", "true"), HaveKeyWithValue("ACTION", "replay"),
			HaveKeyWithValue("DRAINER", "orders")))
		Expect(outbox.Unpublished(ctx, long)).To(Equal(100), "a dry run changes nothing")

		out, err = runWithInput(replayManifest("long-keys", false), "kubectl", "apply", "--namespace", replays, "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("outboxreplay.spillway.io/long-keys created"))
		Eventually(func() *metav1.Condition {
			r := outboxReplay(ctx, "long-keys")
			for _, c := range r.Status.Conditions {
				if c.Type == string(v1alpha1.ReplayComplete) && c.Status == metav1.ConditionTrue {
					return &c
				}
			}
			return nil
		}, time.Minute, time.Second).Should(HaveField("Message", "Replayed 100 of 100 matched rows of "+outbox.Table))
		r := outboxReplay(ctx, "long-keys")
		Expect(r.Status.Matched).To(HaveValue(Equal(int64(100))))
		Expect(r.Status.Changed).To(HaveValue(Equal(int64(100))))
		Expect(r.Status.RowIDs).To(HaveLen(100))
		Expect(long).To(ContainElements(r.Status.RowIDs))
		table, _ := getOutboxReplays()
		AddReportEntry("kubectl get outboxreplays", table)

		Eventually(func() (int, error) { return ledger.Missing(long) }, time.Minute).Should(BeZero(), "every replayed row reached the queue")
		lost, duplicates := ledger.Account(append(append([]string{}, good...), long...))
		Expect(lost).To(BeEmpty())
		Expect(duplicates).To(BeZero(), "no row was published twice")
		Expect(ledger.Total()).To(Equal(300), "nothing else was published")
		Eventually(func() string { _, rows := getOutboxDrainers(replays); return rows[0]["POISONED"] }, time.Minute, time.Second).Should(Equal("0"))

		out, err = run("kubectl", "patch", "outboxreplay", "long-keys", "--namespace", replays, "--type=merge", "-p", `{"spec":{"dryRun":true}}`)
		Expect(err).To(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("spec is immutable: an OutboxReplay records one change; create another"))
		Expect(mustRun("kubectl", "get", "events", "--namespace", replays, "--field-selector", "involvedObject.name=long-keys")).
			To(ContainSubstring("Replayed 100 of 100 matched rows"))
	})

	It("lets the namespace's editors replay and its viewers read the record, through the roles aggregated to edit and view", func(ctx SpecContext) {
		for _, who := range []struct{ account, role string }{{"ops-editor", "edit"}, {"ops-viewer", "view"}} {
			Expect(k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: who.account, Namespace: replays}})).To(Succeed())
			Expect(k8s.Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: who.account, Namespace: replays},
				RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: who.role},
				Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: who.account, Namespace: replays}},
			})).To(Succeed())
		}
		canI := func(verb, account string) func() string {
			return func() string {
				out, _ := run("kubectl", "auth", "can-i", verb, "outboxreplays.spillway.io", "--namespace", replays,
					"--as", "system:serviceaccount:"+replays+":"+account)
				return strings.TrimSpace(out)
			}
		}
		// The controller manager aggregates the roles into edit and view.
		Eventually(canI("create", "ops-editor"), time.Minute).Should(Equal("yes"))
		Expect(canI("delete", "ops-editor")()).To(Equal("yes"))
		Expect(canI("patch", "ops-editor")()).To(Equal("no"), "the record is not edited")
		Eventually(canI("list", "ops-viewer"), time.Minute).Should(Equal("yes"))
		Expect(canI("create", "ops-viewer")()).To(Equal("no"), "a viewer reads the record, and replays nothing")
	})
})
