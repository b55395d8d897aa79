package status

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/outbox"
)

// PoisonedBy is the outbox's most common last errors as the status shows
// them: already scrubbed and cut by the read, at the second's precision the
// status keeps, so an unchanged outbox writes no new status.
func PoisonedBy(o *outbox.OutboxStatus) []v1alpha1.PoisonCause {
	var out []v1alpha1.PoisonCause
	for _, c := range o.PoisonedBy {
		cause := v1alpha1.PoisonCause{LastError: c.LastError, Count: c.Count}
		if c.OldestEnqueuedAt != nil {
			at := metav1.NewTime(c.OldestEnqueuedAt.Truncate(time.Second))
			cause.OldestEnqueuedAt = &at
		}
		out = append(out, cause)
	}
	return out
}
