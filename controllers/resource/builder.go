// Package resource builds the child objects of an OutboxDrainer: one pure
// builder per object, whose Update is the mutate function of
// controllerutil.CreateOrUpdate.
package resource

import (
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

// ResourceBuilder builds one child object.
type ResourceBuilder interface {
	// Build returns the object with only its name and namespace, for
	// CreateOrUpdate to fetch.
	Build() client.Object
	// Update brings a fetched or new object to the desired state, leaving
	// alone the fields the API server or others own.
	Update(client.Object) error
	// Wanted says whether the object should exist at all.
	Wanted() bool
}

// OutboxDrainerResourceBuilder builds the children of one OutboxDrainer.
type OutboxDrainerResourceBuilder struct {
	Instance *v1alpha1.OutboxDrainer
	Scheme   *runtime.Scheme
	// Image is the drainer image unless the spec overrides it: the
	// operator's own, so the operator and its fleets run the same version.
	Image string
}

// ResourceBuilders lists the children in the order they are applied: the
// ServiceAccount before the pods that run as it, the PodDisruptionBudget
// after the Deployment it protects.
func (b *OutboxDrainerResourceBuilder) ResourceBuilders() []ResourceBuilder {
	return []ResourceBuilder{
		b.ServiceAccount(),
		b.MetricsService(),
		b.Deployment(),
		b.PodDisruptionBudget(),
	}
}

// DesiredReplicas is the fleet's size: zero while paused.
func DesiredReplicas(od *v1alpha1.OutboxDrainer) int32 {
	if od.Spec.Paused || od.Spec.Replicas == nil {
		return 0
	}
	return *od.Spec.Replicas
}

// SelectorLabels select one fleet's pods; they never change, as a
// Deployment's selector cannot.
func SelectorLabels(od *v1alpha1.OutboxDrainer) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":      "spillway",
		"app.kubernetes.io/component": "drainer",
		"app.kubernetes.io/instance":  od.Name,
	}
}

// Selector is SelectorLabels as a label selector string.
func Selector(od *v1alpha1.OutboxDrainer) string {
	return labels.SelectorFromSet(SelectorLabels(od)).String()
}

// labelsOf are the labels of every child object.
func labelsOf(od *v1alpha1.OutboxDrainer) map[string]string {
	l := SelectorLabels(od)
	l["app.kubernetes.io/managed-by"] = "spillway-operator"
	return l
}

// mergeInto sets ours on top of an object's labels or annotations, keeping
// those that others set.
func mergeInto(existing, ours map[string]string) map[string]string {
	if existing == nil {
		existing = map[string]string{}
	}
	for k, v := range ours {
		existing[k] = v
	}
	return existing
}
