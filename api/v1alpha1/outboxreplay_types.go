package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReplayAction is what an OutboxReplay does to the rows it picks.
//
// +kubebuilder:validation:Enum=replay;park
type ReplayAction string

const (
	// ReplayActionReplay resets the rows' attempts, last error and due
	// time, so the fleet publishes them again; a parked row is unparked.
	ReplayActionReplay ReplayAction = "replay"
	// ReplayActionPark takes the rows out of the poisoned count without
	// deleting them: parked_at is set and they are never claimed, kept for
	// a later replay or an export.
	ReplayActionPark ReplayAction = "park"
)

// DrainerReference names an OutboxDrainer in the same namespace.
type DrainerReference struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
}

// RowSelector picks poisoned rows of the outbox, or with parked the parked
// ones. Every criterion set must hold; with none, every poisoned row is
// picked, up to the limit, oldest first. A row under a live lease is never
// picked.
//
// +kubebuilder:validation:XValidation:rule="!has(self.enqueuedSince) || !has(self.enqueuedBefore) || self.enqueuedSince < self.enqueuedBefore",fieldPath=".enqueuedBefore",reason="FieldValueInvalid",messageExpression="'enqueuedBefore %s must be later than enqueuedSince %s: the range is [enqueuedSince, enqueuedBefore)'.format([string(self.enqueuedBefore), string(self.enqueuedSince)])"
type RowSelector struct {
	// IDs are row ids as text: a UUID or a number, as the id column holds.
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=255
	// +listType=set
	// +optional
	IDs []string `json:"ids,omitempty"`
	// LastErrorPattern is an SQL LIKE pattern on last_error, case-sensitive:
	// % is any text, _ any one character, \ escapes the next one.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	LastErrorPattern string `json:"lastErrorPattern,omitempty"`
	// EnqueuedSince picks rows enqueued at or after this time.
	// +optional
	EnqueuedSince *metav1.Time `json:"enqueuedSince,omitempty"`
	// EnqueuedBefore picks rows enqueued before this time.
	// +optional
	EnqueuedBefore *metav1.Time `json:"enqueuedBefore,omitempty"`
	// Parked picks parked rows instead of poisoned ones, to replay them.
	// +optional
	Parked bool `json:"parked,omitempty"`
	// Limit is how many rows are changed at most, oldest first.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	// +kubebuilder:default=1000
	// +optional
	Limit int32 `json:"limit,omitempty"`
}

// OutboxReplaySpec is one change of an outbox's poisoned rows.
//
// +kubebuilder:validation:XValidation:rule="!(self.action == 'park' && has(self.selector) && has(self.selector.parked) && self.selector.parked)",fieldPath=".selector.parked",reason="FieldValueInvalid",message="parked: true picks parked rows, which park cannot take: they are parked already (replay them instead)"
type OutboxReplaySpec struct {
	// DrainerRef names the OutboxDrainer whose outbox, database Secret,
	// table mapping and maxAttempts the change uses.
	// +required
	DrainerRef DrainerReference `json:"drainerRef"`
	// Action is replay or park.
	// +required
	Action ReplayAction `json:"action"`
	// Selector picks the rows.
	// +kubebuilder:default={limit:1000}
	// +optional
	Selector RowSelector `json:"selector,omitzero"`
	// DryRun counts and records the rows that would change, and changes
	// none.
	// +kubebuilder:default=false
	// +optional
	DryRun bool `json:"dryRun"`
}

// OutboxReplayStatus records what the change matched and did.
type OutboxReplayStatus struct {
	// ObservedGeneration is the generation the operator acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Table is the outbox table the change ran on.
	// +optional
	Table string `json:"table,omitempty"`
	// MaxAttempts is the OutboxDrainer's poison threshold the change used.
	// +optional
	MaxAttempts int32 `json:"maxAttempts,omitempty"`
	// Matched is the number of rows the selector picked when the change
	// began, at most its limit.
	// +optional
	Matched *int64 `json:"matched,omitempty"`
	// Changed is the number of rows replayed or parked: 0 in a dry run.
	// Fewer than matched when rows were locked, leased or changed by others
	// meanwhile; they were left alone.
	// +optional
	Changed *int64 `json:"changed,omitempty"`
	// RowIDs are the ids of the first 100 rows changed, or in a dry run
	// matched.
	// +listType=atomic
	// +optional
	RowIDs []string `json:"rowIDs,omitempty"`
	// StartTime is when the change first ran.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime is when it was carried out; it is never run again.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// OutboxReplay replays or parks an outbox's poisoned rows, once. Its spec is
// immutable and its status records what matched and what changed, so the
// resource is the audit trail of the change.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=orp,categories=spillway
// +kubebuilder:printcolumn:name="Drainer",type=string,JSONPath=`.spec.drainerRef.name`
// +kubebuilder:printcolumn:name="Action",type=string,JSONPath=`.spec.action`
// +kubebuilder:printcolumn:name="DryRun",type=boolean,JSONPath=`.spec.dryRun`
// +kubebuilder:printcolumn:name="Matched",type=integer,JSONPath=`.status.matched`
// +kubebuilder:printcolumn:name="Changed",type=integer,JSONPath=`.status.changed`
// +kubebuilder:printcolumn:name="Complete",type=string,JSONPath=`.status.conditions[?(@.type=="Complete")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type OutboxReplay struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: an OutboxReplay records one change; create another"
	// +required
	Spec   OutboxReplaySpec   `json:"spec"`
	Status OutboxReplayStatus `json:"status,omitzero"`
}

// OutboxReplayList is a list of OutboxReplays.
//
// +kubebuilder:object:root=true
type OutboxReplayList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []OutboxReplay `json:"items"`
}

// OutboxReplay condition types.
const (
	// ReplayComplete is True once the change was carried out (reason
	// RowsReplayed, RowsParked or DryRun), and then never runs again. While
	// False, its reason says what it waits for: Running (a long change goes
	// on in its next run), or OutboxDrainerNotFound, SecretNotFound, InvalidDatabaseURL,
	// ConnectionFailed, TableNotUsable or QueryFailed, each retried with a
	// backoff; or InvalidSelector, which is not (see ReplayFailed).
	ReplayComplete ConditionType = "Complete"
	// ReplayFailed is True when the change cannot be carried out as
	// written (InvalidSelector: the selector does not fit the table), and
	// is not retried: the spec is immutable, so create another. False is
	// AsExpected.
	ReplayFailed ConditionType = "Failed"
)

// OutboxReplay condition reasons, besides the OutboxDrainer's database ones.
const (
	ReasonRunning               = "Running"
	ReasonOutboxDrainerNotFound = "OutboxDrainerNotFound"
	ReasonInvalidSelector       = "InvalidSelector"
	ReasonRowsReplayed          = "RowsReplayed"
	ReasonRowsParked            = "RowsParked"
	ReasonDryRun                = "DryRun"
)
