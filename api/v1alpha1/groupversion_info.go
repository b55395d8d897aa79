// Package v1alpha1 holds the OutboxDrainer API: one resource declares one
// fleet of drainers and reports its outbox's health.
//
// +kubebuilder:object:generate=true
// +groupName=spillway.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of the OutboxDrainer API.
	GroupVersion = schema.GroupVersion{Group: "spillway.io", Version: "v1alpha1"}

	// SchemeBuilder registers the API's types.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
