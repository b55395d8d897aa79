// Package resource builds the child objects of an OutboxDrainer: one pure
// builder per object, whose Build is the whole of what the operator applies
// with server-side apply. A field it leaves out is not the operator's, and a
// field it sets is reverted when someone edits it.
package resource

import (
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

// ResourceBuilder builds one child object.
type ResourceBuilder interface {
	// Build returns the desired object: every field the operator owns, and
	// the OutboxDrainer as its controller.
	Build() (client.Object, error)
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
// after the Deployment it protects. A fleet that names an existing
// ServiceAccount gets none of its own.
func (b *OutboxDrainerResourceBuilder) ResourceBuilders() []ResourceBuilder {
	var builders []ResourceBuilder
	if b.Instance.Spec.ServiceAccountName == "" {
		builders = append(builders, b.ServiceAccount())
	}
	return append(builders,
		b.MetricsService(),
		b.Deployment(),
		b.PodDisruptionBudget(),
	)
}

// ManagedByLabel marks every object the operator creates; the operator's
// cache holds only objects that carry it.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedBy      = "spillway-operator"
)

// ServiceAccountName is the ServiceAccount the drainers run as.
func ServiceAccountName(od *v1alpha1.OutboxDrainer) string {
	if od.Spec.ServiceAccountName != "" {
		return od.Spec.ServiceAccountName
	}
	return od.Name
}

// owned sets the OutboxDrainer as obj's controller.
func (b *OutboxDrainerResourceBuilder) owned(obj client.Object) (client.Object, error) {
	if err := controllerutil.SetControllerReference(b.Instance, obj, b.Scheme); err != nil {
		return nil, err
	}
	return obj, nil
}

// DesiredReplicas is the fleet's size: zero while paused; with
// autoscaling, the count in its status, and minReplicas until it has one.
func DesiredReplicas(od *v1alpha1.OutboxDrainer) int32 {
	switch {
	case od.Spec.Paused:
		return 0
	case od.Spec.Autoscaling != nil:
		if a := od.Status.Autoscaling; a != nil {
			return a.DesiredReplicas
		}
		return ptr.Deref(od.Spec.Autoscaling.MinReplicas, 1)
	case od.Spec.Replicas == nil:
		return 0
	}
	return *od.Spec.Replicas
}

// The labels that select a fleet's pods: the instance names the fleet.
const (
	ComponentLabel = "app.kubernetes.io/component"
	Drainer        = "drainer"
	InstanceLabel  = "app.kubernetes.io/instance"
)

// SelectorLabels select one fleet's pods; they never change, as a
// Deployment's selector cannot.
func SelectorLabels(od *v1alpha1.OutboxDrainer) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name": "spillway",
		ComponentLabel:           Drainer,
		InstanceLabel:            od.Name,
	}
}

// Selector is SelectorLabels as a label selector string.
func Selector(od *v1alpha1.OutboxDrainer) string {
	return labels.SelectorFromSet(SelectorLabels(od)).String()
}

// labelsOf are the labels of every child object.
func labelsOf(od *v1alpha1.OutboxDrainer) map[string]string {
	l := SelectorLabels(od)
	l[ManagedByLabel] = ManagedBy
	return l
}
