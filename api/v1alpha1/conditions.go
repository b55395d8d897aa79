package v1alpha1

// ConditionType is the type of an OutboxDrainer condition. Every condition
// carries the generation it was computed for.
type ConditionType string

const (
	// ConditionReady is True when every desired drainer is ready and the
	// outbox was read. Otherwise it is False with the first reason that
	// applies: ResourceConflict, Paused, ScaledToZero, SecretNotFound,
	// OutboxNotReadYet, TableNotUsable or StatementRefused (the drainers
	// cannot drain the table), DatabaseUnreachable, BrokerBlocked (drainers
	// say a memory or disk alarm blocks their broker), ReplicasNotReady.
	ConditionReady ConditionType = "Ready"
	// ConditionDatabaseReachable is True when the last read of the outbox
	// succeeded, and False with the reason it did not: SecretNotFound,
	// InvalidDatabaseURL, ConnectionFailed, TableNotUsable, QueryFailed; or
	// StatementRefused, when the outbox was read but the database refuses
	// the drainers' claims or settles (a privilege revoked, a column gone).
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
	// ConditionStalled is True when the fleet cannot make progress without
	// someone's help: an object of the same name it does not control
	// (ResourceConflict), a missing Secret (SecretNotFound), a database URL
	// or table it cannot use (InvalidDatabaseURL, TableNotUsable,
	// StatementRefused), or a stuck rollout (ProgressDeadlineExceeded). kstatus reads it as Failed.
	ConditionStalled ConditionType = "Stalled"
	// ConditionReconciling is True while the fleet is on its way to Ready
	// on its own: rolling out (RollingOut), drainers starting
	// (ReplicasNotReady) or waiting out a broker's alarm (BrokerBlocked), the outbox not read yet (OutboxNotReadYet) or its
	// database unreachable for now (DatabaseUnreachable). kstatus reads it
	// as InProgress; with neither it and Stalled True, the fleet is Current.
	ConditionReconciling ConditionType = "Reconciling"
)

// Condition reasons.
const (
	ReasonAllReplicasReady         = "AllReplicasReady"
	ReasonReplicasNotReady         = "ReplicasNotReady"
	ReasonBrokerBlocked            = "BrokerBlocked"
	ReasonPaused                   = "Paused"
	ReasonScaledToZero             = "ScaledToZero"
	ReasonSecretNotFound           = "SecretNotFound"
	ReasonDatabaseUnreachable      = "DatabaseUnreachable"
	ReasonOutboxRead               = "OutboxRead"
	ReasonInvalidDatabaseURL       = "InvalidDatabaseURL"
	ReasonConnectionFailed         = "ConnectionFailed"
	ReasonTableNotUsable           = "TableNotUsable"
	ReasonStatementRefused         = "StatementRefused"
	ReasonQueryFailed              = "QueryFailed"
	ReasonRollingOut               = "RollingOut"
	ReasonRolloutComplete          = "RolloutComplete"
	ReasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"
	ReasonReconcileFailed          = "ReconcileFailed"
	ReasonPoisonedRows             = "PoisonedRows"
	ReasonAsExpected               = "AsExpected"
	ReasonResourceConflict         = "ResourceConflict"
	ReasonOutboxNotReadYet         = "OutboxNotReadYet"
)
