package resource

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
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

// Build returns the Service. The fields the API server assigns, such as
// the cluster IP, are not in it, so they are left alone.
func (b *MetricsServiceBuilder) Build() (client.Object, error) {
	return b.owned(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: b.Instance.Name + "-metrics", Namespace: b.Instance.Namespace, Labels: labelsOf(b.Instance)},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: SelectorLabels(b.Instance),
			// A drainer is unready exactly when its database or broker is
			// down, which is when its metrics matter most.
			PublishNotReadyAddresses: true,
			Ports: []corev1.ServicePort{{
				Name:       MetricsPortName,
				Port:       MetricsPort,
				TargetPort: intstr.FromString(MetricsPortName),
				Protocol:   corev1.ProtocolTCP,
			}},
		},
	})
}

// Wanted is always true.
func (b *MetricsServiceBuilder) Wanted() bool { return true }
