package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PoisonCause is one last error shared by poisoned rows, for triage.
type PoisonCause struct {
	// LastError is the rows' last_error, with anything that looks like a
	// secret removed, cut at 256 bytes; empty when they have none.
	LastError string `json:"lastError"`
	// Count is the number of poisoned rows with this last error.
	Count int64 `json:"count"`
	// OldestEnqueuedAt is the oldest of their enqueue times; unset when the
	// table has no enqueuedAt column.
	// +optional
	OldestEnqueuedAt *metav1.Time `json:"oldestEnqueuedAt,omitempty"`
}
