package controllers_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/commands"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
)

// fetch returns "status: body" of a GET, or the error.
func fetch(url string) func() string {
	return func() string {
		resp, err := http.Get(url)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d: %s", resp.StatusCode, body)
	}
}

var _ = Describe("spillway manager", func() {
	It("takes the leader lease, serves /healthz and /readyz, and /metrics, with the outboxes' numbers, only to scrapers the API server authorizes, and traces its reconciles", func(ctx SpecContext) {
		ns := namespace(ctx)
		probeAddr, metricsAddr := suite.FreeAddr(), suite.FreeAddr()
		GinkgoT().Setenv("KUBECONFIG", kubeconfig)
		collector, err := testenv.StartCollector()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(collector.Stop)
		GinkgoT().Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.Endpoint())
		GinkgoT().Setenv("OTEL_BSP_SCHEDULE_DELAY", "200") // milliseconds
		managerCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- commands.ManagerCommand(managerCtx, []string{
				// The suite's reconciler builds with the same image and
				// applies with the same field manager, so the two agree.
				"--drainer-image=" + reconciler.Image, "--log-level=debug",
				"--leader-elect", "--leader-election-namespace=" + ns,
				"--health-probe-addr=" + probeAddr, "--metrics-addr=" + metricsAddr, "--metrics-secure",
				"--watch-namespaces=" + ns,
			})
		}()
		DeferCleanup(func() {
			stop()
			Eventually(done, 30*time.Second).Should(Receive(BeNil()))
			ctrl.SetLogger(GinkgoLogr)
		})

		Eventually(fetch("http://" + probeAddr + "/healthz")).Should(Equal("200: ok"))
		Eventually(fetch("http://" + probeAddr + "/readyz")).Should(Equal("200: ok"))
		lease := &coordinationv1.Lease{}
		Eventually(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "operator.spillway.io"}, lease)
		}).Should(Succeed())
		Expect(*lease.Spec.HolderIdentity).NotTo(BeEmpty())

		reader := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: testenv.UniqueObjectName("metrics-reader")},
			Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
		}
		Expect(k8s.Create(ctx, reader)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(k8s.Delete(ctx, reader)).To(Succeed()) })
		token := func(name string) string {
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
			Expect(k8s.Create(ctx, sa)).To(Succeed())
			req := &authenticationv1.TokenRequest{}
			Expect(k8s.SubResource("token").Create(ctx, sa, req)).To(Succeed())
			return req.Status.Token
		}
		prometheus, stranger := token("prometheus"), token("stranger")
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: reader.Name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: reader.Name},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: ns}},
		}
		Expect(k8s.Create(ctx, binding)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(k8s.Delete(ctx, binding)).To(Succeed()) })

		connectionSecrets(ctx, ns)
		table := outboxTable(ctx)
		runSQL(ctx, `INSERT INTO `+table+` (event_type, payload) SELECT 'order.created', '{}' FROM generate_series(1, 3)`)
		Expect(k8s.Create(ctx, outboxDrainer(ns, table))).To(Succeed())

		scrape := func(token string) func() string {
			return func() string {
				req, err := http.NewRequest(http.MethodGet, "https://"+metricsAddr+"/metrics", nil)
				Expect(err).NotTo(HaveOccurred())
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				// The certificate is self-signed, as in a default install.
				insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
				resp, err := insecure.Do(req)
				if err != nil {
					return err.Error()
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				return fmt.Sprintf("%d: %s", resp.StatusCode, body)
			}
		}
		Eventually(scrape(prometheus)).Should(And(HavePrefix("200: "),
			ContainSubstring(`controller_runtime_reconcile_total{controller="outboxdrainer"`),
			ContainSubstring(`controller_runtime_reconcile_total{controller="outboxreplay"`),
			ContainSubstring(`spillway_outbox_backlog{name="orders",namespace="`+ns+`"} 3`),
			ContainSubstring(`spillway_outbox_probe_duration_seconds_count{name="orders",namespace="`+ns+`"}`),
			ContainSubstring(`spillway_outboxdrainer_ready{name="orders",namespace="`+ns+`"} 0`)))
		Expect(scrape("")()).To(HavePrefix("401: "), "no token")
		Expect(scrape(stranger)()).To(HavePrefix("403: "), "a token without get on /metrics")
		Expect(fetch("http://"+metricsAddr+"/metrics")()).To(HavePrefix("400: "), "no plain HTTP")

		Eventually(collector.Spans).Should(ContainElement(And(
			HaveField("Name", "reconcile OutboxDrainer"),
			HaveField("Attributes", And(HaveKeyWithValue("spillway.fleet", "orders"), HaveKeyWithValue("k8s.namespace.name", ns))),
			HaveField("Resource", HaveKeyWithValue("service.name", "spillway-operator")))))
		Expect(collector.Errors()).To(BeEmpty())
	})
})
