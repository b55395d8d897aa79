package resource

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ServiceAccountBuilder builds the drainers' ServiceAccount. A drainer never
// talks to the Kubernetes API, so no token is mounted.
type ServiceAccountBuilder struct{ *OutboxDrainerResourceBuilder }

// ServiceAccount returns the ServiceAccount's builder.
func (b *OutboxDrainerResourceBuilder) ServiceAccount() *ServiceAccountBuilder {
	return &ServiceAccountBuilder{b}
}

// Build returns the ServiceAccount, which mounts no API token.
func (b *ServiceAccountBuilder) Build() (client.Object, error) {
	return b.owned(&corev1.ServiceAccount{
		ObjectMeta:                   metav1.ObjectMeta{Name: b.Instance.Name, Namespace: b.Instance.Namespace, Labels: labelsOf(b.Instance)},
		AutomountServiceAccountToken: ptr.To(false),
	})
}

// Wanted is always true: a fleet that names its own ServiceAccount has no
// builder for one.
func (b *ServiceAccountBuilder) Wanted() bool { return true }
