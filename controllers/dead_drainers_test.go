package controllers_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/resource"
	"github.com/spillway-io/spillway/test/testenv"
)

var _ = Describe("The claims of dead drainers", func() {
	var (
		ns, table string
		od        *v1alpha1.OutboxDrainer
	)
	BeforeEach(func(ctx SpecContext) {
		ns = namespace(ctx)
		table = outboxTable(ctx)
		connectionSecrets(ctx, ns)
		od = outboxDrainer(ns, table)
	})

	// node creates a Node; envtest runs no kubelet, so it only exists.
	node := func(ctx context.Context) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testenv.UniqueObjectName("node")}}
		Expect(k8s.Create(ctx, n)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8s.Delete(ctx, n))).To(Succeed()) })
		return n
	}
	// drainerPod creates a pod as the fleet's ReplicaSet would, bound to a
	// node, and has it hold claims on rows, as its drainer would.
	drainerPod := func(ctx context.Context, name string, on *corev1.Node) *corev1.Pod {
		labels := resource.SelectorLabels(od)
		labels[resource.ManagedByLabel] = resource.ManagedBy
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec:       corev1.PodSpec{NodeName: on.Name, Containers: []corev1.Container{{Name: resource.ContainerName, Image: "spillway"}}},
		}
		Expect(k8s.Create(ctx, pod)).To(Succeed())
		holdClaims(ctx, table, name)
		return pod
	}

	It("releases at once the claims of a drainer pod that is deleted, that fails, or whose node becomes unreachable, and no others", func(ctx SpecContext) {
		healthy, doomed := node(ctx), node(ctx)
		gone := drainerPod(ctx, "orders-6b9f7c5d4-gbx2k", healthy)
		failed := drainerPod(ctx, "orders-6b9f7c5d4-q7wzp", healthy)
		cutOff := drainerPod(ctx, "orders-6b9f7c5d4-m4v8t", doomed)
		alive := drainerPod(ctx, "orders-6b9f7c5d4-c2hnx", healthy)
		terminating := drainerPod(ctx, "orders-6b9f7c5d4-x9kzr", healthy)
		// A drainer run outside the cluster against the same table, and a
		// pod of another fleet on the node that becomes unreachable: they
		// are not this fleet's to release.
		holdClaims(ctx, table, "laptop-1")
		other := drainerPod(ctx, "invoices-5c8d7b9f6-tq2vd", doomed)
		other.Labels[resource.InstanceLabel] = "invoices"
		Expect(k8s.Update(ctx, other)).To(Succeed())
		Expect(k8s.Create(ctx, od)).To(Succeed())
		Eventually(func() *metav1.Time { return get(ctx, od.DeepCopy()).Status.LastProbeTime }).ShouldNot(BeNil())
		// Terminating: shutting down, it releases its own claims.
		Expect(k8s.Delete(ctx, terminating)).To(Succeed())
		Expect(get(ctx, terminating.DeepCopy()).DeletionTimestamp).NotTo(BeNil(), "no kubelet confirms its termination")

		untouched := func() {
			GinkgoHelper()
			for _, drainer := range []string{alive.Name, terminating.Name, other.Name, "laptop-1"} {
				Expect(heldClaims(ctx, table, drainer)).To(Equal(claimsPerDrainer), "%s keeps its claims", drainer)
			}
		}
		untouched()

		// A force delete, as after a lost node or by hand.
		Expect(k8s.Delete(ctx, gone, client.GracePeriodSeconds(0))).To(Succeed())
		Eventually(func() int { return heldClaims(ctx, table, gone.Name) }).Should(BeZero())
		Expect(dueNow(ctx, table)).To(Equal(claimsPerDrainer), "released rows are due at once")
		Eventually(events(ctx, od)).Should(ContainElement("Normal ReleasedClaims: Released 5 claims of drainer " +
			gone.Name + ": its pod " + gone.Name + " is gone"))
		untouched()

		// Failed, as after an eviction by the kubelet.
		failed.Status.Phase = corev1.PodFailed
		Expect(k8s.Status().Update(ctx, failed)).To(Succeed())
		Eventually(func() int { return heldClaims(ctx, table, failed.Name) }).Should(BeZero())
		Eventually(events(ctx, od)).Should(ContainElement("Normal ReleasedClaims: Released 5 claims of drainer " +
			failed.Name + ": its pod " + failed.Name + " failed"))
		untouched()

		// The node controller's taint on a node it cannot reach.
		doomed.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}
		Expect(k8s.Update(ctx, doomed)).To(Succeed())
		Eventually(func() int { return heldClaims(ctx, table, cutOff.Name) }).Should(BeZero())
		Eventually(events(ctx, od)).Should(ContainElement("Normal ReleasedClaims: Released 5 claims of drainer " + cutOff.Name +
			": its node " + doomed.Name + " is unreachable (taint node.kubernetes.io/unreachable)"))
		untouched()

		// Still cut off, it claims again: every read releases them.
		holdClaims(ctx, table, cutOff.Name)
		Eventually(func() int { return heldClaims(ctx, table, cutOff.Name) }).WithTimeout(2*statusInterval + 5*time.Second).Should(BeZero())
		untouched()
	})
})

// claimsPerDrainer is how many rows holdClaims claims.
const claimsPerDrainer = 5

// holdClaims inserts rows claimed by drainer under a live lease, as its
// claim would leave them.
func holdClaims(ctx context.Context, table, drainer string) {
	runSQL(ctx, `INSERT INTO `+table+` (event_type, payload, claimed_by, claimed_at)
		SELECT 'order.created', '{}', $1, now() FROM generate_series(1, $2)`, drainer, claimsPerDrainer)
}

// heldClaims counts the pending rows drainer holds: a release clears
// claimed_by.
func heldClaims(ctx context.Context, table, drainer string) int {
	var n int
	Expect(db.QueryRow(ctx, `SELECT count(*) FROM `+table+`
		WHERE published_at IS NULL AND claimed_by = $1`, drainer).Scan(&n)).To(Succeed())
	return n
}

// dueNow counts the pending rows nobody holds, due for a claim.
func dueNow(ctx context.Context, table string) int {
	var n int
	Expect(db.QueryRow(ctx, `SELECT count(*) FROM `+table+`
		WHERE published_at IS NULL AND claimed_by IS NULL AND available_at <= now()`).Scan(&n)).To(Succeed())
	return n
}
