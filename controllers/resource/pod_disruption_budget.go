package resource

import (
	"fmt"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// PodDisruptionBudgetBuilder builds the budget that keeps a voluntary
// disruption (a node drain) from stopping every drainer at once.
type PodDisruptionBudgetBuilder struct{ *OutboxDrainerResourceBuilder }

// PodDisruptionBudget returns the PodDisruptionBudget's builder.
func (b *OutboxDrainerResourceBuilder) PodDisruptionBudget() *PodDisruptionBudgetBuilder {
	return &PodDisruptionBudgetBuilder{b}
}

// Build returns the PodDisruptionBudget's name and namespace.
func (b *PodDisruptionBudgetBuilder) Build() client.Object {
	return &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: b.Instance.Name, Namespace: b.Instance.Namespace}}
}

// Update sets the budget, one drainer down at a time, and the owner.
func (b *PodDisruptionBudgetBuilder) Update(obj client.Object) error {
	pdb, ok := obj.(*policyv1.PodDisruptionBudget)
	if !ok {
		return fmt.Errorf("update PodDisruptionBudget: got %T", obj)
	}
	pdb.Labels = mergeInto(pdb.Labels, labelsOf(b.Instance))
	pdb.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(1))
	pdb.Spec.Selector = &metav1.LabelSelector{MatchLabels: SelectorLabels(b.Instance)}
	return controllerutil.SetControllerReference(b.Instance, pdb, b.Scheme)
}

// Wanted is true for a fleet of more than one drainer: a budget on a single
// replica would block every node drain.
func (b *PodDisruptionBudgetBuilder) Wanted() bool { return DesiredReplicas(b.Instance) > 1 }
