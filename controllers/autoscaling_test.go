package controllers_test

import (
	"context"
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

var _ = Describe("An autoscaled fleet", func() {
	// autoscaled creates a fleet over an outbox of its own, sized by a.
	autoscaled := func(ctx context.Context, a v1alpha1.Autoscaling) (*v1alpha1.OutboxDrainer, string) {
		ns := namespace(ctx)
		table := outboxTable(ctx)
		connectionSecrets(ctx, ns)
		od := outboxDrainer(ns, table)
		od.Spec.Replicas = nil
		od.Spec.Autoscaling = &a
		Expect(k8s.Create(ctx, od)).To(Succeed())
		return od, table
	}

	It("runs no pods while idle at minReplicas 0, scales up within a status interval of a backlog, and back to zero after the stabilization window", func(ctx SpecContext) {
		od, table := autoscaled(ctx, v1alpha1.Autoscaling{
			MinReplicas: ptr.To(int32(0)), MaxReplicas: 4, TargetBacklogPerReplica: 100,
			ScaleDownStabilization: metav1.Duration{Duration: 3 * time.Second},
		})
		ns := od.Namespace
		replicas := func() *int32 { return get(ctx, deploymentOf(ctx, od)).Spec.Replicas }
		autoscaling := func() *v1alpha1.AutoscalingStatus { return get(ctx, od.DeepCopy()).Status.Autoscaling }

		Eventually(autoscaling).Should(And(Not(BeNil()), HaveField("Reason", "backlog 0 at 100 per replica wants 0")))
		Expect(replicas()).To(Equal(ptr.To(int32(0))), "an idle fleet runs no pods")
		Expect(condition(ctx, od, v1alpha1.ConditionReady)()).To(HaveField("Reason", "ScaledToZero"))

		runSQL(ctx, `INSERT INTO `+table+` (event_type, payload) SELECT 'order.created', '{}' FROM generate_series(1, 250)`)
		Eventually(replicas).WithTimeout(statusInterval+2*time.Second).WithPolling(50*time.Millisecond).
			Should(Equal(ptr.To(int32(3))), "the next read of the backlog scales the fleet up")
		Eventually(autoscaling).Should(And(HaveField("DesiredReplicas", int32(3)), HaveField("LastScaleTime", Not(BeNil()))),
			"the status follows the Deployment in the same reconcile")
		Eventually(events(ctx, od)).Should(ContainElement("Normal Scaled: Scaled from 0 to 3: backlog 250 at 100 per replica wants 3"))
		out := kubectl("get", "outboxdrainer", od.Name, "-n", ns, "-o", "wide")
		Expect(strings.Fields(strings.Split(out, "\n")[0])).To(ContainElement("DESIRED"), out)
		Expect(strings.Fields(strings.Split(out, "\n")[1])).To(HaveLen(9), out)
		Expect(strings.Fields(strings.Split(out, "\n")[1])[8]).To(Equal("RabbitMQ"), out)

		// The drainers publish everything: nothing more to do, once the
		// higher recommendations have left the window.
		runSQL(ctx, `UPDATE `+table+` SET published_at = now()`)
		Eventually(replicas).WithTimeout(od.Spec.Autoscaling.ScaleDownStabilization.Duration + 2*statusInterval + 2*time.Second).
			Should(Equal(ptr.To(int32(0))))
		Eventually(events(ctx, od)).Should(ContainElement(HavePrefix("Normal Scaled: Scaled from 3 to 0: backlog 0 at 100 per replica wants 0")))
	})

	It("refuses kubectl scale, which would fight autoscaling, and says who owns the count", func(ctx SpecContext) {
		od, _ := autoscaled(ctx, v1alpha1.Autoscaling{MaxReplicas: 4, TargetBacklogPerReplica: 100})
		out, err := exec.Command("kubectl", "--kubeconfig", kubeconfig, "scale", "outboxdrainer/"+od.Name, "-n", od.Namespace, "--replicas=3").CombinedOutput()
		Expect(err).To(HaveOccurred())
		Expect(string(out)).To(ContainSubstring("spec.replicas: Forbidden: replicas is 3, but autoscaling sets the replica count"))
		Eventually(func() *int32 { return get(ctx, deploymentOf(ctx, od)).Spec.Replicas }).Should(Equal(ptr.To(int32(1))),
			"minReplicas (1 by default) for an empty backlog")
	})
})
