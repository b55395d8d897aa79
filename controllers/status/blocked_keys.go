package status

import (
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/outbox"
)

// maxShownKey is where the status cuts an ordering key: a key is the
// application's, and could be any length.
const maxShownKey = 256

// BlockedKeys is the outbox's blocked keys as the status shows them, at the
// second's precision the status keeps; nil when the read counts none (no
// ordering, or failures skip).
func BlockedKeys(o *outbox.OutboxStatus) *v1alpha1.BlockedKeys {
	b := o.Blocked
	if b == nil {
		return nil
	}
	out := &v1alpha1.BlockedKeys{Count: b.Count, OldestKey: b.OldestKey}
	if len(out.OldestKey) > maxShownKey {
		out.OldestKey = strings.ToValidUTF8(out.OldestKey[:maxShownKey], "")
	}
	if b.OldestEnqueuedAt != nil {
		at := metav1.NewTime(b.OldestEnqueuedAt.Truncate(time.Second))
		out.OldestEnqueuedAt = &at
	}
	return out
}
