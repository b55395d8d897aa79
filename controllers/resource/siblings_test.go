package resource

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

var _ = Describe("The Deployment's siblings", func() {
	var od *v1alpha1.OutboxDrainer
	BeforeEach(func() { od = outboxDrainer() })

	It("are applied ServiceAccount first and PodDisruptionBudget last, each owned by the OutboxDrainer", func() {
		var kinds []string
		for _, b := range builderFor(od).ResourceBuilders() {
			obj := b.Build()
			Expect(b.Update(obj)).To(Succeed())
			Expect(obj.GetOwnerReferences()).To(ConsistOf(HaveField("UID", od.UID)))
			Expect(obj.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "spillway-operator"))
			kinds = append(kinds, fmt.Sprintf("%T", obj))
		}
		Expect(kinds).To(Equal([]string{"*v1.ServiceAccount", "*v1.Service", "*v1.Deployment", "*v1.PodDisruptionBudget"}))
	})

	It("give the drainers a ServiceAccount that mounts no API token", func() {
		b := builderFor(od).ServiceAccount()
		sa := b.Build().(*corev1.ServiceAccount)
		Expect(b.Update(sa)).To(Succeed())
		Expect(sa.Name).To(Equal("orders"))
		Expect(sa.AutomountServiceAccountToken).To(Equal(ptr.To(false)))
	})

	It("expose every drainer's metrics port, ready or not, and keep the cluster IP the API server assigned", func() {
		b := builderFor(od).MetricsService()
		svc := b.Build().(*corev1.Service)
		svc.Spec.ClusterIP = "10.0.0.7"
		Expect(b.Update(svc)).To(Succeed())
		Expect(svc.Name).To(Equal("orders-metrics"))
		Expect(svc.Spec.ClusterIP).To(Equal("10.0.0.7"))
		Expect(svc.Spec.Selector).To(Equal(SelectorLabels(od)))
		Expect(svc.Spec.PublishNotReadyAddresses).To(BeTrue())
		Expect(svc.Spec.Ports).To(ConsistOf(corev1.ServicePort{
			Name: "metrics", Port: 8080, TargetPort: intstr.FromString("metrics"), Protocol: corev1.ProtocolTCP,
		}))
	})

	DescribeTable("want a PodDisruptionBudget only for more than one running drainer",
		func(replicas int32, paused, wanted bool) {
			od.Spec.Replicas, od.Spec.Paused = ptr.To(replicas), paused
			Expect(builderFor(od).PodDisruptionBudget().Wanted()).To(Equal(wanted))
		},
		Entry("one drainer: a budget would block every node drain", int32(1), false, false),
		Entry("two drainers", int32(2), false, true),
		Entry("three drainers, paused", int32(3), true, false),
	)

	It("let a node drain take one drainer at a time", func() {
		b := builderFor(od).PodDisruptionBudget()
		pdb := b.Build().(*policyv1.PodDisruptionBudget)
		Expect(b.Update(pdb)).To(Succeed())
		Expect(pdb.Spec.MaxUnavailable).To(Equal(ptr.To(intstr.FromInt32(1))))
		Expect(pdb.Spec.Selector).To(Equal(&metav1.LabelSelector{MatchLabels: SelectorLabels(od)}))
	})
})
