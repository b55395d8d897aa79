package resource

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// MetricsPort serves the drainer's /metrics, /healthz and /readyz.
const (
	MetricsPort     = 8080
	MetricsPortName = "metrics"
)

// MetricsServiceBuilder builds the Service that Prometheus scrapes.
type MetricsServiceBuilder struct{ *OutboxDrainerResourceBuilder }

// MetricsService returns the metrics Service's builder.
func (b *OutboxDrainerResourceBuilder) MetricsService() *MetricsServiceBuilder {
	return &MetricsServiceBuilder{b}
}

// Build returns the Service's name and namespace.
func (b *MetricsServiceBuilder) Build() client.Object {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: b.Instance.Name + "-metrics", Namespace: b.Instance.Namespace}}
}

// Update sets the port, the selector and the owner, and leaves the fields
// the API server assigns (the cluster IP) alone.
func (b *MetricsServiceBuilder) Update(obj client.Object) error {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return fmt.Errorf("update metrics Service: got %T", obj)
	}
	svc.Labels = mergeInto(svc.Labels, labelsOf(b.Instance))
	svc.Spec.Type = corev1.ServiceTypeClusterIP
	svc.Spec.Selector = SelectorLabels(b.Instance)
	// A drainer is unready exactly when its database or broker is down,
	// which is when its metrics matter most.
	svc.Spec.PublishNotReadyAddresses = true
	svc.Spec.Ports = []corev1.ServicePort{{
		Name:       MetricsPortName,
		Port:       MetricsPort,
		TargetPort: intstr.FromString(MetricsPortName),
		Protocol:   corev1.ProtocolTCP,
	}}
	return controllerutil.SetControllerReference(b.Instance, svc, b.Scheme)
}

// Wanted is always true.
func (b *MetricsServiceBuilder) Wanted() bool { return true }
