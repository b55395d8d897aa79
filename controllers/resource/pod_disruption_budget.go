package resource

import (
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PodDisruptionBudgetBuilder builds the budget that keeps a voluntary
// disruption (a node drain) from stopping every drainer at once.
type PodDisruptionBudgetBuilder struct{ *OutboxDrainerResourceBuilder }

// PodDisruptionBudget returns the PodDisruptionBudget's builder.
func (b *OutboxDrainerResourceBuilder) PodDisruptionBudget() *PodDisruptionBudgetBuilder {
	return &PodDisruptionBudgetBuilder{b}
}

// Build returns the budget: one drainer down at a time. Unhealthy drainers
// may always be evicted: they are unready exactly when the database or the
// broker is down, and with the default IfHealthyBudget policy an outage
// would then block every node drain.
func (b *PodDisruptionBudgetBuilder) Build() (client.Object, error) {
	return b.owned(&policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: b.Instance.Name, Namespace: b.Instance.Namespace, Labels: labelsOf(b.Instance)},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable:             ptr.To(intstr.FromInt32(1)),
			Selector:                   &metav1.LabelSelector{MatchLabels: SelectorLabels(b.Instance)},
			UnhealthyPodEvictionPolicy: ptr.To(policyv1.AlwaysAllow),
		},
	})
}

// Wanted is true for a fleet of more than one drainer. With one, a budget
// of one unavailable pod would let a drain take the only drainer anyway,
// so it would only add an object; with none there is nothing to protect.
// An autoscaled fleet that may grow past one keeps its budget as it
// scales, rather than create and delete it with every scale.
func (b *PodDisruptionBudgetBuilder) Wanted() bool {
	if a := b.Instance.Spec.Autoscaling; a != nil {
		return a.MaxReplicas > 1
	}
	return DesiredReplicas(b.Instance) > 1
}
