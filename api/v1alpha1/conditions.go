package v1alpha1

// ConditionType is the type of an OutboxDrainer condition. Every condition
// carries the generation it was computed for.
type ConditionType string

const (
	// ConditionReady is True when every desired drainer is ready and the
	// outbox was read. Otherwise it is False with the first reason that
	// applies: Paused, ScaledToZero, SecretNotFound, DatabaseUnreachable,
	// ReplicasNotReady.
	ConditionReady ConditionType = "Ready"
	// ConditionDatabaseReachable is True when the last read of the outbox
	// succeeded, and False with the reason it did not: SecretNotFound,
	// InvalidDatabaseURL, ConnectionFailed, TableNotUsable, QueryFailed.
	ConditionDatabaseReachable ConditionType = "DatabaseReachable"
	// ConditionProgressing is True while the Deployment rolls out or scales,
	// and False once it is done (RolloutComplete) or has given up
	// (ProgressDeadlineExceeded).
	ConditionProgressing ConditionType = "Progressing"
	// ConditionDegraded is True when the fleet needs attention although it
	// may be draining: a child object could not be applied
	// (ReconcileFailed), the rollout is stuck (ProgressDeadlineExceeded) or
	// rows are poisoned (PoisonedRows). False is AsExpected.
	ConditionDegraded ConditionType = "Degraded"
)

// Condition reasons.
const (
	ReasonAllReplicasReady         = "AllReplicasReady"
	ReasonReplicasNotReady         = "ReplicasNotReady"
	ReasonPaused                   = "Paused"
	ReasonScaledToZero             = "ScaledToZero"
	ReasonSecretNotFound           = "SecretNotFound"
	ReasonDatabaseUnreachable      = "DatabaseUnreachable"
	ReasonOutboxRead               = "OutboxRead"
	ReasonInvalidDatabaseURL       = "InvalidDatabaseURL"
	ReasonConnectionFailed         = "ConnectionFailed"
	ReasonTableNotUsable           = "TableNotUsable"
	ReasonQueryFailed              = "QueryFailed"
	ReasonRollingOut               = "RollingOut"
	ReasonRolloutComplete          = "RolloutComplete"
	ReasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"
	ReasonReconcileFailed          = "ReconcileFailed"
	ReasonPoisonedRows             = "PoisonedRows"
	ReasonAsExpected               = "AsExpected"
)
