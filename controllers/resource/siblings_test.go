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
			obj, err := b.Build()
			Expect(err).NotTo(HaveOccurred())
			Expect(obj.GetOwnerReferences()).To(ConsistOf(HaveField("UID", od.UID)))
			Expect(obj.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "spillway-operator"))
			kinds = append(kinds, fmt.Sprintf("%T", obj))
		}
		Expect(kinds).To(Equal([]string{"*v1.ServiceAccount", "*v1.Service", "*v1.Deployment", "*v1.PodDisruptionBudget"}))
	})

	It("give the drainers a ServiceAccount that mounts no API token", func() {
		obj, err := builderFor(od).ServiceAccount().Build()
		Expect(err).NotTo(HaveOccurred())
		sa := obj.(*corev1.ServiceAccount)
		Expect(sa.Name).To(Equal("orders"))
		Expect(sa.AutomountServiceAccountToken).To(Equal(ptr.To(false)))
	})

	It("expose every drainer's metrics port, ready or not, and leave the cluster IP to the API server", func() {
		obj, err := builderFor(od).MetricsService().Build()
		Expect(err).NotTo(HaveOccurred())
		svc := obj.(*corev1.Service)
		Expect(svc.Name).To(Equal("orders-metrics"))
		Expect(svc.Spec.ClusterIP).To(BeEmpty(), "not applied, so not owned")
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
		Entry("one drainer: a budget of one unavailable would protect nothing", int32(1), false, false),
		Entry("two drainers", int32(2), false, true),
		Entry("three drainers, paused", int32(3), true, false),
	)

	It("let a node drain take one drainer at a time, and unready ones always", func() {
		obj, err := builderFor(od).PodDisruptionBudget().Build()
		Expect(err).NotTo(HaveOccurred())
		pdb := obj.(*policyv1.PodDisruptionBudget)
		Expect(pdb.Spec.MaxUnavailable).To(Equal(ptr.To(intstr.FromInt32(1))))
		Expect(pdb.Spec.UnhealthyPodEvictionPolicy).To(Equal(ptr.To(policyv1.AlwaysAllow)),
			"drainers are unready while the database is down, which must not block node drains")
		Expect(pdb.Spec.Selector).To(Equal(&metav1.LabelSelector{MatchLabels: SelectorLabels(od)}))
	})
})
