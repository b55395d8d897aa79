package controllers_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/controllers"
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

var _ = Describe("spillway manager", Label("integration"), func() {
	It("takes the leader lease and serves /healthz, /readyz and /metrics", func(ctx SpecContext) {
		leaseNamespace := namespace(ctx)
		probeAddr, metricsAddr := testenv.FreeAddr(), testenv.FreeAddr()
		GinkgoT().Setenv("KUBECONFIG", kubeconfig)
		managerCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- controllers.ManagerCommand(managerCtx, []string{
				// The suite's reconciler builds with the same image, so the
				// two do not rewrite each other's Deployments meanwhile.
				"--drainer-image=" + reconciler.Image,
				"--leader-elect", "--leader-election-namespace=" + leaseNamespace,
				"--health-probe-addr=" + probeAddr, "--metrics-addr=" + metricsAddr,
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
			return k8s.Get(ctx, client.ObjectKey{Namespace: leaseNamespace, Name: "operator.spillway.io"}, lease)
		}).Should(Succeed())
		Expect(*lease.Spec.HolderIdentity).NotTo(BeEmpty())
		Eventually(fetch("http://" + metricsAddr + "/metrics")).Should(And(HavePrefix("200: "),
			ContainSubstring(`controller_runtime_reconcile_total{controller="outboxdrainer"`)))
	})
})
