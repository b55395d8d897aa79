package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/test/testenv"
)

const (
	operatorNamespace = "spillway-system"
	release           = "spillway"
	shop              = "shop"
	fleetName         = "orders"
	journeyEvents     = 50_000
)

// drainerLabels select the sample fleet's drainer pods.
var drainerLabels = map[string]string{
	"app.kubernetes.io/name":      "spillway",
	"app.kubernetes.io/component": "drainer",
	"app.kubernetes.io/instance":  fleetName,
}

var operatorLabels = map[string]string{"app.kubernetes.io/component": "operator"}

func splitHostPort(raw string) (string, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", err
	}
	return u.Hostname(), u.Port(), nil
}

// sampleManifests are config/samples against the local services, the
// suite's table and exchange, with the status read every second.
func sampleManifests(table, exchange string) string {
	manifests, err := testenv.SampleFleet(table, exchange, "1s")
	Expect(err).NotTo(HaveOccurred())
	return manifests
}

// getOutboxDrainers runs kubectl get outboxdrainers, and parses its table.
func getOutboxDrainers(namespace string) (string, []map[string]string) {
	out := mustRun("kubectl", "get", "outboxdrainers", "--namespace", namespace)
	return out, testenv.ParseTable(out)
}

// tokenSubject is the subject of the service-account token the node
// mounted into a pod: who the pod's processes are to the API server.
func tokenSubject(pod corev1.Pod) string {
	paths, err := filepath.Glob(filepath.Join(cluster.Node.Dir(), "pods", string(pod.UID), "volumes", "kube-api-access-*", "token"))
	Expect(err).NotTo(HaveOccurred())
	Expect(paths).To(HaveLen(1), "the pod's projected service-account token")
	raw, err := os.ReadFile(paths[0])
	Expect(err).NotTo(HaveOccurred())
	parts := strings.Split(string(raw), ".")
	Expect(parts).To(HaveLen(3))
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	Expect(err).NotTo(HaveOccurred())
	var claims struct {
		Sub string `json:"sub"`
	}
	Expect(json.Unmarshal(payload, &claims)).To(Succeed())
	return claims.Sub
}

func leaseHolder(ctx context.Context) string {
	lease := &coordinationv1.Lease{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: "operator.spillway.io"}, lease); err != nil {
		return ""
	}
	if lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// holdsLease says whether the lease's holder is a process of pod: the
// manager's identity is its hostname, the pod's name, and a random suffix.
func holdsLease(ctx context.Context, pod string) bool {
	return strings.HasPrefix(leaseHolder(ctx), pod+"_")
}

func outboxDrainer(ctx context.Context) *v1alpha1.OutboxDrainer {
	od := &v1alpha1.OutboxDrainer{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: shop, Name: fleetName}, od)).To(Succeed())
	return od
}

// journey is what the journey's specs share: the outbox the fleet drains,
// its exchange and queue, the ledger of what reached the queue, and the
// faults run so far.
type journey struct {
	outbox   testenv.Outbox
	topology testenv.Topology
	ledger   *testenv.Ledger
	faults   faultLog
}

var _ = Describe("Spillway on the local cluster", Ordered, func() {
	env := &journey{}

	BeforeAll(func(ctx SpecContext) {
		ch, err := services.Broker.Channel()
		Expect(err).NotTo(HaveOccurred())
		env.topology, err = testenv.DeclareTopology(ch, "#", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { env.topology.Delete(ch); ch.Close() })
		env.ledger, err = testenv.StartLedger(services.Broker, env.topology.Queue)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(env.ledger.Stop)
		env.outbox = testenv.Outbox{DB: services.DB, Table: "public." + testenv.UniqueName("fleet_outbox")}
		DeferCleanup(func(ctx SpecContext) {
			_, err := services.DB.Exec(ctx, "DROP TABLE IF EXISTS "+env.outbox.Table)
			Expect(err).NotTo(HaveOccurred())
		})
	})

	AfterAll(func() {
		if len(env.faults) > 0 {
			AddReportEntry("fleet faults", env.faults.String())
			fmt.Fprint(GinkgoWriter, env.faults.String())
		}
	})

	It("installs the chart with helm: the operator pod runs as the chart's ServiceAccount, turns Ready and takes its leader lease", func(ctx SpecContext) {
		namespace(ctx, operatorNamespace)
		mustRun("helm", append([]string{"install", release, chart, "--namespace", operatorNamespace, "--wait", "--timeout", "3m"}, helmImages()...)...)

		var operator corev1.Pod
		Eventually(func(g Gomega) {
			list := pods(ctx, operatorNamespace, operatorLabels)
			g.Expect(list).To(HaveLen(1))
			operator = list[0]
			g.Expect(ready(operator)).To(BeTrue(), "Running and Ready")
		}, 2*time.Minute).Should(Succeed())
		Expect(operator.Spec.Containers[0].Image).To(Equal(spillwayImage), "the registry's image, by digest")
		Expect(operator.Status.ContainerStatuses[0].ImageID).To(Equal(spillwayImage), "the digest the node pulled")
		Expect(operator.Spec.ServiceAccountName).To(Equal(release))
		Expect(tokenSubject(operator)).To(Equal("system:serviceaccount:"+operatorNamespace+":"+release),
			"its only credential is the chart's ServiceAccount's token")
		Eventually(func() bool { return holdsLease(ctx, operator.Name) }, time.Minute).Should(BeTrue(),
			"the lease operator.spillway.io is held by the operator pod's manager")
		Expect(logOf(operatorNamespace, operator.Name, "manager")).NotTo(ContainSubstring("forbidden"))
	})

	It("migrates the outbox with spillway migrate in a pod that runs to completion", func(ctx SpecContext) {
		namespace(ctx, shop)
		migrate := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "spillway-migrate", Namespace: shop},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				SecurityContext: &corev1.PodSecurityContext{
					RunAsNonRoot:   ptrTo(true),
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				Containers: []corev1.Container{{
					Name:  "migrate",
					Image: spillwayImage,
					Args:  []string{"migrate", "--database-url=" + testenv.DatabaseURL(), "--table=" + env.outbox.Table, "--notify"},
					SecurityContext: &corev1.SecurityContext{
						AllowPrivilegeEscalation: ptrTo(false),
						Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					},
				}},
			},
		}
		Expect(k8s.Create(ctx, migrate)).To(Succeed())
		Eventually(func(g Gomega) {
			got, err := getPod(ctx, migrate)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got.Status.Phase).To(Equal(corev1.PodSucceeded))
		}, 2*time.Minute).Should(Succeed())
		Expect(logOf(shop, "spillway-migrate", "migrate")).To(ContainSubstring("created table " + env.outbox.Table))
	})

	It("applies the sample Secrets and an OutboxDrainer of two replicas: two drainer pods turn Ready", func(ctx SpecContext) {
		out, err := runWithInput(sampleManifests(env.outbox.Table, env.topology.Exchange), "kubectl", "apply", "--namespace", shop, "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("outboxdrainer.spillway.io/orders created"))
		Eventually(func() []string { return readyPods(ctx, shop, drainerLabels) }, 2*time.Minute).Should(HaveLen(2))
		for _, p := range pods(ctx, shop, drainerLabels) {
			Expect(p.Spec.Containers[0].Image).To(Equal(spillwayImage), "the operator's own image, from --drainer-image")
			Expect(p.Status.ContainerStatuses[0].ImageID).To(Equal(spillwayImage))
		}
	})

	It("drains 50,000 events: kubectl get outboxdrainers shows the backlog fall to 0, READY True and REPLICAS 2, and every event reaches the queue", func(ctx SpecContext) {
		drainers := readyPods(ctx, shop, drainerLabels)
		start := time.Now()
		ids, err := env.outbox.Insert(ctx, journeyEvents)
		Expect(err).NotTo(HaveOccurred())
		claimants := map[string]bool{}
		var table []string
		var backlogs []int
		Eventually(func(g Gomega) {
			claims, err := env.outbox.Claims(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			for by := range claims {
				claimants[by] = true
			}
			out, rows := getOutboxDrainers(shop)
			g.Expect(rows).To(HaveLen(1))
			row := rows[0]
			if len(table) == 0 {
				table = append(table, strings.SplitN(out, "\n", 2)[0])
			}
			table = append(table, fmt.Sprintf("%5.1fs  %s", time.Since(start).Seconds(), strings.TrimSpace(strings.SplitN(out, "\n", 2)[1])))
			if b, err := strconv.Atoi(row["BACKLOG"]); err == nil {
				backlogs = append(backlogs, b)
			}
			// The status is read every second: first it shows the events.
			g.Expect(slices.ContainsFunc(backlogs, func(b int) bool { return b > 0 })).To(BeTrue(), "the status shows the seeded events")
			g.Expect(row["BACKLOG"]).To(Equal("0"))
			g.Expect(row["READY"]).To(Equal("True"))
			g.Expect(row["REPLICAS"]).To(Equal("2"))
		}, 5*time.Minute, time.Second).Should(Succeed())
		drained := time.Since(start)
		AddReportEntry("kubectl get outboxdrainers, every second", strings.Join(table, "\n"))

		Eventually(func() (int, error) { return env.ledger.Missing(ids) }, time.Minute).Should(BeZero(), "every event reached the queue")
		lost, duplicates := env.ledger.Account(ids)
		Expect(lost).To(BeEmpty())
		published, err := env.outbox.PublishedBy(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(published).To(HaveLen(2))
		for _, d := range drainers {
			Expect(published).To(HaveKeyWithValue(d, BeNumerically(">", 0)), "claimed_by holds the drainers' pod names")
			Expect(claimants).To(HaveKey(d), "claimed_by showed the pod names while it drained")
		}
		AddReportEntry("journey", fmt.Sprintf("%d events drained in %s (%.0f/s) by %v; lost %d, duplicates %d",
			journeyEvents, drained.Round(100*time.Millisecond), float64(journeyEvents)/drained.Seconds(), published, len(lost), duplicates))
	})

	It("passes helm test, whose hook pod runs kubectl on the node", func(ctx SpecContext) {
		out := mustRun("helm", "test", release, "--namespace", operatorNamespace, "--timeout", "3m")
		Expect(out).To(MatchRegexp(`TEST SUITE:\s+spillway-test`))
		Expect(out).To(MatchRegexp(`Phase:\s+Succeeded`))
		Expect(logOf(operatorNamespace, "spillway-test", "operator-available")).To(ContainSubstring("condition met"))
		Expect(logOf(operatorNamespace, "spillway-test", "crd-served")).To(ContainSubstring("No resources found"))
	})

	describeFaults(env)

	describeBrokerCluster(env)

	describeDatabaseFailover(env)

	describeAutoscaling()
})

func ptrTo[T any](v T) *T { return &v }
