package controllers_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/outbox"
)

var _ = Describe("A broker that blocks publishing", func() {
	It("shows in the Ready condition while the fleet's drainers flag it, and goes once they lower the flag", func(ctx SpecContext) {
		ns, table := namespace(ctx), outboxTable(ctx)
		connectionSecrets(ctx, ns)
		od := outboxDrainer(ns, table)
		Expect(k8s.Create(ctx, od)).To(Succeed())
		Eventually(condition(ctx, od, v1alpha1.ConditionReady)).Should(HaveField("Reason", "ReplicasNotReady"), "envtest runs no pods")

		// Two drainers whose broker blocks them, as their claim loops flag it.
		store, err := outbox.OpenStore(ctx, db, outbox.TableSpec{Name: table})
		Expect(err).NotTo(HaveOccurred())
		flags := []*outbox.BlockedFlag{store.BlockedFlag(outbox.TableSpec{Name: table}), store.BlockedFlag(outbox.TableSpec{Name: table})}
		for _, f := range flags {
			DeferCleanup(f.Lower)
			Expect(f.Raise(ctx)).To(Succeed())
		}
		Eventually(condition(ctx, od, v1alpha1.ConditionReady), 3*statusInterval).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "BrokerBlocked"),
			HaveField("Message", "0 of 2 drainers are ready; 2 say the broker blocks publishing (a memory or disk alarm in its cluster), and claim nothing until it clears")))
		Expect(condition(ctx, od, v1alpha1.ConditionStalled)()).To(HaveField("Status", metav1.ConditionFalse), "an alarm clears on its own")

		for _, f := range flags {
			f.Lower()
		}
		Eventually(condition(ctx, od, v1alpha1.ConditionReady), 3*statusInterval+5*time.Second).Should(HaveField("Reason", "ReplicasNotReady"))
	})
})
