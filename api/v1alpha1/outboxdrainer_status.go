package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// OutboxDrainerStatus is the fleet as observed, and the outbox's health.
type OutboxDrainerStatus struct {
	// ObservedGeneration is the generation the operator last acted on, even
	// when it could not apply it: the Stalled and Reconciling conditions say
	// how that went (kstatus conventions).
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Replicas is the number of drainer pods.
	Replicas int32 `json:"replicas"`
	// ReadyReplicas is the number of drainer pods that are ready.
	ReadyReplicas int32 `json:"readyReplicas"`
	// Selector of the drainer pods, for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`
	// Sink is the kind of sink the drainers publish to: RabbitMQ or
	// Webhook.
	// +optional
	Sink string `json:"sink,omitempty"`

	// Backlog is the number of pending rows that are not poisoned.
	// +optional
	Backlog *int64 `json:"backlog,omitempty"`
	// Poisoned is the number of pending rows at maxAttempts: they are not
	// retried until they are replayed.
	// +optional
	Poisoned *int64 `json:"poisoned,omitempty"`
	// PoisonedBy lists the most common last errors of the poisoned rows,
	// most rows first (at most 3), for triage; none on a table without a
	// lastError column.
	// +listType=atomic
	// +optional
	PoisonedBy []PoisonCause `json:"poisonedBy,omitempty"`
	// Parked is the number of parked rows, kept for a later replay; unset
	// on a table without a parkedAt column.
	// +optional
	Parked *int64 `json:"parked,omitempty"`
	// OldestPendingAge is the age of the oldest row of the backlog, by the
	// database's clock; 0s when the backlog is empty, unset when the table
	// has no enqueuedAt column.
	// +optional
	OldestPendingAge *metav1.Duration `json:"oldestPendingAge,omitempty"`
	// CountCapped is true when the last read stopped counting at the
	// operator's limit (--probe-count-limit): backlog, poisoned and
	// oldestPendingAge are then lower bounds, "at least".
	// +optional
	CountCapped bool `json:"countCapped,omitempty"`
	// BlockedKeys counts the ordering keys whose later rows wait for a
	// failed row, with spec.ordering and onFailure block; unset otherwise,
	// and when a read fails.
	// +optional
	BlockedKeys *BlockedKeys `json:"blockedKeys,omitempty"`
	// LastProbeTime is the time of the good read that last changed this
	// status. A read that finds everything as it was does not rewrite the
	// status, so while DatabaseReachable is True the numbers hold as of the
	// latest read, whose time is the operator's metric
	// spillway_outbox_last_read_timestamp_seconds. When a read fails,
	// backlog, poisoned and oldestPendingAge are removed rather than shown
	// as current, and this keeps the time of the last good read.
	// +optional
	LastProbeTime *metav1.Time `json:"lastProbeTime,omitempty"`

	// Autoscaling is what autoscaling decided, and why; set while
	// spec.autoscaling is.
	// +optional
	Autoscaling *AutoscalingStatus `json:"autoscaling,omitempty"`

	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// BlockedKeys are the ordering keys a failed row holds back.
type BlockedKeys struct {
	// Count is the number of blocked keys (a lower bound when countCapped).
	Count int64 `json:"count"`
	// OldestKey is the key whose failed row is the oldest, by enqueue order.
	// +optional
	OldestKey string `json:"oldestKey,omitempty"`
	// OldestEnqueuedAt is that row's enqueued_at: the key has had events
	// waiting since then. Unset on a table without enqueuedAt.
	// +optional
	OldestEnqueuedAt *metav1.Time `json:"oldestEnqueuedAt,omitempty"`
}

// AutoscalingStatus is the count autoscaling set, and why.
type AutoscalingStatus struct {
	// DesiredReplicas is the number of drainers autoscaling set.
	DesiredReplicas int32 `json:"desiredReplicas"`
	// Reason says how the last read of the outbox led to it.
	// +optional
	Reason string `json:"reason,omitempty"`
	// LastScaleTime is when autoscaling last changed the count.
	// +optional
	LastScaleTime *metav1.Time `json:"lastScaleTime,omitempty"`
	// Recommendations are the recommendations of the scale-down
	// stabilization window that can still hold the count up, oldest and
	// highest first: each is higher than every later one.
	// +listType=atomic
	// +optional
	Recommendations []Recommendation `json:"recommendations,omitempty"`
}

// Recommendation is the count one read of the outbox recommended.
type Recommendation struct {
	Replicas int32       `json:"replicas"`
	Time     metav1.Time `json:"time"`
}
