package resource

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// ServiceAccountBuilder builds the drainers' ServiceAccount. A drainer never
// talks to the Kubernetes API, so no token is mounted.
type ServiceAccountBuilder struct{ *OutboxDrainerResourceBuilder }

// ServiceAccount returns the ServiceAccount's builder.
func (b *OutboxDrainerResourceBuilder) ServiceAccount() *ServiceAccountBuilder {
	return &ServiceAccountBuilder{b}
}

// Build returns the ServiceAccount's name and namespace.
func (b *ServiceAccountBuilder) Build() client.Object {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: b.Instance.Name, Namespace: b.Instance.Namespace}}
}

// Update sets the labels, the token opt-out and the owner.
func (b *ServiceAccountBuilder) Update(obj client.Object) error {
	sa, ok := obj.(*corev1.ServiceAccount)
	if !ok {
		return fmt.Errorf("update ServiceAccount: got %T", obj)
	}
	sa.Labels = mergeInto(sa.Labels, labelsOf(b.Instance))
	sa.AutomountServiceAccountToken = ptr.To(false)
	return controllerutil.SetControllerReference(b.Instance, sa, b.Scheme)
}

// Wanted is always true.
func (b *ServiceAccountBuilder) Wanted() bool { return true }
