package controllers_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/test/testenv"
)

// silentListener accepts TCP connections and never answers: a database
// that is up as far as the network can tell, and stuck beyond it.
func silentListener() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	DeferCleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// kstatusOf is the fleet's status as Argo CD and Flux compute it.
func kstatusOf(ctx context.Context, od *v1alpha1.OutboxDrainer) func() *kstatus.Result {
	return func() *kstatus.Result {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("OutboxDrainer"))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(od), u)).To(Succeed())
		res, err := kstatus.Compute(u)
		Expect(err).NotTo(HaveOccurred())
		return res
	}
}

// markReady plays the Deployment controller and the kubelet, which envtest
// does not run: every drainer of the current template is up and ready.
func markReady(ctx context.Context, d *appsv1.Deployment, replicas int32) {
	d.Status = appsv1.DeploymentStatus{
		ObservedGeneration: d.Generation,
		Replicas:           replicas, UpdatedReplicas: replicas, ReadyReplicas: replicas, AvailableReplicas: replicas,
	}
	Expect(k8s.Status().Update(ctx, d)).To(Succeed())
}

var _ = Describe("An OutboxDrainer in a shared cluster", func() {
	var (
		ns    string
		table string
		od    *v1alpha1.OutboxDrainer
	)
	BeforeEach(func(ctx SpecContext) {
		ns = namespace(ctx)
		table = outboxTable(ctx)
		od = outboxDrainer(ns, table)
		connectionSecrets(ctx, ns)
	})

	Describe("objects of the same name that it did not create", func() {
		// The application's own ServiceAccount and PodDisruptionBudget,
		// named like the fleet.
		appServiceAccount := func() *corev1.ServiceAccount {
			return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: od.Name, Namespace: ns, Labels: map[string]string{"app": od.Name}}}
		}
		appBudget := func() *policyv1.PodDisruptionBudget {
			return &policyv1.PodDisruptionBudget{
				ObjectMeta: metav1.ObjectMeta{Name: od.Name, Namespace: ns, Labels: map[string]string{"app": od.Name}},
				Spec: policyv1.PodDisruptionBudgetSpec{
					MinAvailable: ptr.To(intstr.FromInt32(1)),
					Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": od.Name}},
				},
			}
		}
		// untouched says an object is exactly as the application left it.
		untouched := func(g Gomega, ctx context.Context, obj client.Object, resourceVersion string) {
			now := obj.DeepCopyObject().(client.Object)
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), now)).To(Succeed(), "%T %s is gone", obj, obj.GetName())
			g.Expect(now.GetResourceVersion()).To(Equal(resourceVersion), "%T %s was written", obj, obj.GetName())
			g.Expect(now.GetOwnerReferences()).To(BeEmpty())
		}

		It("leaves the application's ServiceAccount and PodDisruptionBudget alone, says so, and leaves them behind when it is deleted", func(ctx SpecContext) {
			sa, pdb := appServiceAccount(), appBudget()
			Expect(k8s.Create(ctx, sa)).To(Succeed())
			Expect(k8s.Create(ctx, pdb)).To(Succeed())
			od.Spec.Replicas = ptr.To(int32(1)) // no budget wanted: the path that deleted the application's
			Expect(k8s.Create(ctx, od)).To(Succeed())

			Eventually(condition(ctx, od, v1alpha1.ConditionReady)).Should(And(
				Not(BeNil()), HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "ResourceConflict"),
				HaveField("Message", ContainSubstring(fmt.Sprintf("ServiceAccount %s/%s", ns, od.Name)))))
			Eventually(events(ctx, od)).Should(ContainElement(And(
				HavePrefix("Warning ResourceConflict: "), ContainSubstring(fmt.Sprintf("ServiceAccount %s/%s", ns, od.Name)))))
			Consistently(func(g Gomega) {
				untouched(g, ctx, sa, sa.ResourceVersion)
				untouched(g, ctx, pdb, pdb.ResourceVersion)
			}, 3*time.Second, 200*time.Millisecond).Should(Succeed())
			Expect(get(ctx, sa.DeepCopy()).AutomountServiceAccountToken).To(BeNil())

			Expect(k8s.Delete(ctx, od)).To(Succeed())
			Eventually(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(od), od.DeepCopy()) }).
				Should(Satisfy(func(err error) bool { return err != nil }))
			untouched(Default, ctx, sa, sa.ResourceVersion)
			untouched(Default, ctx, pdb, pdb.ResourceVersion)
		})

		It("applies the rest of the fleet but never the budget that another owns", func(ctx SpecContext) {
			pdb := appBudget()
			Expect(k8s.Create(ctx, pdb)).To(Succeed())
			Expect(k8s.Create(ctx, od)).To(Succeed()) // two replicas: a budget is wanted
			deploymentOf(ctx, od)
			Eventually(condition(ctx, od, v1alpha1.ConditionReady)).Should(And(
				Not(BeNil()), HaveField("Reason", "ResourceConflict"),
				HaveField("Message", ContainSubstring(fmt.Sprintf("PodDisruptionBudget %s/%s", ns, od.Name)))))
			Consistently(func(g Gomega) {
				untouched(g, ctx, pdb, pdb.ResourceVersion)
			}, 2*time.Second, 200*time.Millisecond).Should(Succeed())
		})
	})

	It("follows kstatus: InProgress while the drainers start, Current once ready, Failed while a Secret is missing", func(ctx SpecContext) {
		Expect(k8s.Create(ctx, od)).To(Succeed())
		Eventually(kstatusOf(ctx, od)).Should(HaveField("Status", kstatus.InProgressStatus))

		d := deploymentOf(ctx, od)
		markReady(ctx, d, 2)
		Eventually(kstatusOf(ctx, od)).Should(HaveField("Status", kstatus.CurrentStatus))

		od = get(ctx, od)
		patch := client.MergeFrom(od.DeepCopy())
		od.Spec.Database.URLSecretRef.Name = "not-there"
		Expect(k8s.Patch(ctx, od, patch)).To(Succeed())
		Eventually(kstatusOf(ctx, od)).Should(And(HaveField("Status", kstatus.FailedStatus),
			HaveField("Message", ContainSubstring(`Secret "not-there" (database URL) was not found`))))
		Expect(get(ctx, od.DeepCopy()).Status.ObservedGeneration).To(Equal(od.Generation), "observed, not held back")

		secret(ctx, ns, "not-there", testenv.DatabaseURL())
		Eventually(kstatusOf(ctx, od)).Should(HaveField("Status", kstatus.InProgressStatus), "the rollout of the new Secret's mount")
		markReady(ctx, get(ctx, d), 2)
		Eventually(kstatusOf(ctx, od)).Should(HaveField("Status", kstatus.CurrentStatus))
	})

	It("caches only the objects it labels, not every Deployment in the cluster", func(ctx SpecContext) {
		app := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "shop-api", Namespace: ns},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "shop-api"}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "shop-api"}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "api", Image: "shop-api"}}},
				},
			},
		}
		Expect(k8s.Create(ctx, app)).To(Succeed())
		Expect(k8s.Create(ctx, od)).To(Succeed())
		// The reconciler's client reads the manager's cache.
		Eventually(func() error {
			return reconciler.Get(ctx, client.ObjectKeyFromObject(od), &appsv1.Deployment{})
		}).Should(Succeed(), "the fleet's Deployment, which it labels, is cached")
		Consistently(func() bool {
			return apierrors.IsNotFound(reconciler.Get(ctx, client.ObjectKeyFromObject(app), &appsv1.Deployment{}))
		}, time.Second).Should(BeTrue(), "the application's Deployment is not")
	})

	It("lets a node drain evict drainers that are unready because the database is down", func(ctx SpecContext) {
		Expect(k8s.Create(ctx, od)).To(Succeed())
		pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: od.Name, Namespace: ns}}
		Eventually(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(pdb), pdb) }).Should(Succeed())
		Expect(pdb.Spec.UnhealthyPodEvictionPolicy).To(Equal(ptr.To(policyv1.AlwaysAllow)),
			"with IfHealthyBudget, a database outage makes every drainer unready and blocks every eviction")
	})

	It("keeps a healthy fleet's status fresh and applies its spec at once while six others point at a database that never answers", func(ctx SpecContext) {
		Expect(k8s.Create(ctx, od)).To(Succeed())
		Eventually(func() *metav1.Time { return get(ctx, od.DeepCopy()).Status.LastProbeTime }).ShouldNot(BeNil())

		stuck := silentListener()
		secret(ctx, ns, "stuck-db", "postgres://postgres@"+stuck+"/test?sslmode=disable")
		for i := range 6 {
			s := outboxDrainer(ns, table)
			s.Name = fmt.Sprintf("stuck-%d", i)
			s.Spec.Database.URLSecretRef.Name = "stuck-db"
			Expect(k8s.Create(ctx, s)).To(Succeed())
		}

		fresh := func(g Gomega) {
			last := lastRead(od)
			g.Expect(time.Since(last)).To(BeNumerically("<", 2*statusInterval),
				"the healthy fleet's outbox was last read at %s", last.Format(time.RFC3339Nano))
		}
		Consistently(fresh, 4*statusInterval, 250*time.Millisecond).Should(Succeed())
		for i := range 6 {
			s := &v1alpha1.OutboxDrainer{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("stuck-%d", i), Namespace: ns}}
			Eventually(condition(ctx, s, v1alpha1.ConditionDatabaseReachable)).Should(And(Not(BeNil()),
				HaveField("Reason", "ConnectionFailed"), HaveField("Message", ContainSubstring("no answer within "+probeTimeout.String()))))
		}

		od = get(ctx, od)
		patch := client.MergeFrom(od.DeepCopy())
		od.Spec.BatchSize = 7
		Expect(k8s.Patch(ctx, od, patch)).To(Succeed())
		start := time.Now()
		Eventually(func() []string {
			return deploymentOf(ctx, od).Spec.Template.Spec.Containers[0].Args
		}, 2*time.Second, 50*time.Millisecond).Should(ContainElement("--batch-size=7"))
		GinkgoWriter.Printf("batchSize reached the Deployment in %s\n", time.Since(start))
		Consistently(fresh, 2*statusInterval, 250*time.Millisecond).Should(Succeed())
	})
})
