// Package v1alpha1 holds the OutboxDrainer API: one resource declares one
// fleet of drainers and reports its outbox's health, and an OutboxReplay
// replays or parks its poisoned rows, once. It depends on apimachinery
// only, so that it is cheap to import.
//
// +kubebuilder:object:generate=true
// +groupName=spillway.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of the OutboxDrainer API.
	GroupVersion = schema.GroupVersion{Group: "spillway.io", Version: "v1alpha1"}

	// SchemeBuilder registers the API's types.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &OutboxDrainer{}, &OutboxDrainerList{}, &OutboxReplay{}, &OutboxReplayList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
