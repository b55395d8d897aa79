// Package status computes an OutboxDrainer's conditions from what a
// reconcile observed. Every function is pure.
package status

import (
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/outbox"
)

// Probe is what one read of the referenced Secrets and the outbox found.
// Its zero value is a read that has not happened yet.
type Probe struct {
	// Reason is ReasonOutboxRead, or why the outbox could not be read.
	Reason string
	// Message never includes a secret.
	Message string
	// MissingSecrets describes each referenced Secret or key that does not
	// exist, the broker's included.
	MissingSecrets []string
	// Outbox is set when the read succeeded.
	Outbox *outbox.OutboxStatus
}

// Conflict is a child object's name taken by an object that the
// OutboxDrainer does not control: the operator leaves it alone.
type Conflict struct {
	Kind, Namespace, Name string
	// Controller describes the object's controller, or is empty.
	Controller string
}

func (c *Conflict) Error() string {
	owner := "no controller"
	if c.Controller != "" {
		owner = "controller " + c.Controller
	}
	return fmt.Sprintf("%s %s/%s already exists and is not controlled by this OutboxDrainer (%s); "+
		"the operator leaves it alone: rename the OutboxDrainer or remove the object", c.Kind, c.Namespace, c.Name, owner)
}

// Fleet is the drainers' Deployment as the reconcile left it.
type Fleet struct {
	Generation      int64
	Paused          bool
	DesiredReplicas int32
	// Deployment is nil when it could not be applied.
	Deployment *appsv1.Deployment
	// Conflict is the first child object whose name another object holds;
	// nothing after it was applied.
	Conflict *Conflict
	// ApplyError is the first child object that could not be applied.
	ApplyError error
	// BrokerBlocked is how many drainers said, at the last read of the
	// outbox, that their broker blocks publishing.
	BrokerBlocked int64
}

func condition(t v1alpha1.ConditionType, s metav1.ConditionStatus, generation int64, reason, message string) metav1.Condition {
	return metav1.Condition{Type: string(t), Status: s, ObservedGeneration: generation, Reason: reason, Message: message}
}

// DatabaseReachable is the condition a read of the outbox sets.
func DatabaseReachable(p Probe, generation int64) metav1.Condition {
	if p.Reason == v1alpha1.ReasonOutboxRead {
		return condition(v1alpha1.ConditionDatabaseReachable, metav1.ConditionTrue, generation, p.Reason, p.Message)
	}
	return condition(v1alpha1.ConditionDatabaseReachable, metav1.ConditionFalse, generation, p.Reason, p.Message)
}

// Ready says whether the fleet is draining: every desired drainer ready,
// and the outbox readable with the Secrets the drainers mount.
func Ready(f Fleet, missingSecrets []string, database metav1.Condition) metav1.Condition {
	notReady := func(reason, message string) metav1.Condition {
		return condition(v1alpha1.ConditionReady, metav1.ConditionFalse, f.Generation, reason, message)
	}
	var ready int32
	if f.Deployment != nil {
		ready = f.Deployment.Status.ReadyReplicas
	}
	switch {
	case f.Conflict != nil:
		return notReady(v1alpha1.ReasonResourceConflict, f.Conflict.Error())
	case f.Paused:
		return notReady(v1alpha1.ReasonPaused, "The fleet is paused and scaled to zero; the outbox is not drained")
	case f.DesiredReplicas == 0:
		return notReady(v1alpha1.ReasonScaledToZero, "The fleet has zero replicas; the outbox is not drained")
	case len(missingSecrets) > 0:
		return notReady(v1alpha1.ReasonSecretNotFound, strings.Join(missingSecrets, "; "))
	case database.Type == "":
		return notReady(v1alpha1.ReasonOutboxNotReadYet, "The outbox has not been read yet")
	case database.Status != metav1.ConditionTrue && undrainable[database.Reason]:
		return notReady(database.Reason, database.Message)
	case database.Status != metav1.ConditionTrue:
		return notReady(v1alpha1.ReasonDatabaseUnreachable, database.Message)
	case f.BrokerBlocked > 0:
		return notReady(v1alpha1.ReasonBrokerBlocked, fmt.Sprintf(
			"%d of %d drainers are ready; %d say the broker blocks publishing (a memory or disk alarm in its cluster), and claim nothing until it clears",
			ready, f.DesiredReplicas, f.BrokerBlocked))
	case ready < f.DesiredReplicas:
		return notReady(v1alpha1.ReasonReplicasNotReady, fmt.Sprintf("%d of %d drainers are ready", ready, f.DesiredReplicas))
	}
	return condition(v1alpha1.ConditionReady, metav1.ConditionTrue, f.Generation, v1alpha1.ReasonAllReplicasReady,
		fmt.Sprintf("%d of %d drainers are ready", ready, f.DesiredReplicas))
}

// undrainable are the reasons of a database that answers, but whose table
// the drainers cannot drain: Ready says so in those words.
var undrainable = map[string]bool{v1alpha1.ReasonTableNotUsable: true, v1alpha1.ReasonStatementRefused: true}

// Progressing says whether the Deployment is still rolling out or scaling.
func Progressing(f Fleet) metav1.Condition {
	d := f.Deployment
	if d == nil {
		return condition(v1alpha1.ConditionProgressing, metav1.ConditionUnknown, f.Generation, v1alpha1.ReasonReconcileFailed,
			"The Deployment could not be applied")
	}
	if c := stuck(d); c != nil {
		return condition(v1alpha1.ConditionProgressing, metav1.ConditionFalse, f.Generation, v1alpha1.ReasonProgressDeadlineExceeded, c.Message)
	}
	s := d.Status
	if s.ObservedGeneration < d.Generation || s.UpdatedReplicas < f.DesiredReplicas ||
		s.Replicas > s.UpdatedReplicas || s.AvailableReplicas < f.DesiredReplicas {
		return condition(v1alpha1.ConditionProgressing, metav1.ConditionTrue, f.Generation, v1alpha1.ReasonRollingOut,
			fmt.Sprintf("%d of %d drainers updated, %d available, %d in total", s.UpdatedReplicas, f.DesiredReplicas, s.AvailableReplicas, s.Replicas))
	}
	return condition(v1alpha1.ConditionProgressing, metav1.ConditionFalse, f.Generation, v1alpha1.ReasonRolloutComplete,
		fmt.Sprintf("%d drainers updated and available", s.UpdatedReplicas))
}

// Degraded says whether the fleet needs attention: a failed apply first,
// then a stuck rollout, then poisoned rows.
func Degraded(f Fleet, poisoned int64) metav1.Condition {
	degraded := func(reason, message string) metav1.Condition {
		return condition(v1alpha1.ConditionDegraded, metav1.ConditionTrue, f.Generation, reason, message)
	}
	if f.Conflict != nil {
		return degraded(v1alpha1.ReasonResourceConflict, f.Conflict.Error())
	}
	if f.ApplyError != nil {
		return degraded(v1alpha1.ReasonReconcileFailed, f.ApplyError.Error())
	}
	if f.Deployment != nil {
		if c := stuck(f.Deployment); c != nil {
			return degraded(v1alpha1.ReasonProgressDeadlineExceeded, c.Message)
		}
	}
	if poisoned > 0 {
		return degraded(v1alpha1.ReasonPoisonedRows,
			fmt.Sprintf("%d rows reached maxAttempts and are not retried until they are replayed or parked: "+
				"status.poisonedBy says why, and an OutboxReplay replays or parks them", poisoned))
	}
	return condition(v1alpha1.ConditionDegraded, metav1.ConditionFalse, f.Generation, v1alpha1.ReasonAsExpected, "")
}

// stalledReasons need someone's help: the operator retries, but they do
// not go away on their own.
var stalledReasons = map[string]bool{
	v1alpha1.ReasonResourceConflict:         true,
	v1alpha1.ReasonSecretNotFound:           true,
	v1alpha1.ReasonInvalidDatabaseURL:       true,
	v1alpha1.ReasonTableNotUsable:           true,
	v1alpha1.ReasonStatementRefused:         true,
	v1alpha1.ReasonProgressDeadlineExceeded: true,
}

// Stalled follows kstatus: True when the fleet cannot reach Ready without
// someone's help. ready and database are the conditions computed for this
// reconcile; progressing says whether the rollout gave up.
func Stalled(generation int64, ready, database, progressing metav1.Condition) metav1.Condition {
	for _, c := range []metav1.Condition{ready, database, progressing} {
		if c.Status != metav1.ConditionTrue && stalledReasons[c.Reason] {
			return condition(v1alpha1.ConditionStalled, metav1.ConditionTrue, generation, c.Reason, c.Message)
		}
	}
	return condition(v1alpha1.ConditionStalled, metav1.ConditionFalse, generation, v1alpha1.ReasonAsExpected, "")
}

// Reconciling follows kstatus: True while the fleet is on its way to Ready
// on its own, and never together with Stalled. A paused or scaled-to-zero
// fleet is as asked, so it is not reconciling.
func Reconciling(generation int64, ready, progressing, stalled metav1.Condition) metav1.Condition {
	switch {
	case stalled.Status == metav1.ConditionTrue:
	case progressing.Status == metav1.ConditionTrue:
		return condition(v1alpha1.ConditionReconciling, metav1.ConditionTrue, generation, progressing.Reason, progressing.Message)
	case ready.Status != metav1.ConditionTrue && ready.Reason != v1alpha1.ReasonPaused && ready.Reason != v1alpha1.ReasonScaledToZero:
		return condition(v1alpha1.ConditionReconciling, metav1.ConditionTrue, generation, ready.Reason, ready.Message)
	}
	return condition(v1alpha1.ConditionReconciling, metav1.ConditionFalse, generation, v1alpha1.ReasonAsExpected, "")
}

// deploymentTimedOut is the reason the Deployment controller gives when a
// rollout exceeds its progress deadline.
const deploymentTimedOut = "ProgressDeadlineExceeded"

// stuck returns the Deployment's Progressing condition when the Deployment
// controller has given up on the rollout.
func stuck(d *appsv1.Deployment) *appsv1.DeploymentCondition {
	for i := range d.Status.Conditions {
		c := &d.Status.Conditions[i]
		if c.Type == appsv1.DeploymentProgressing && c.Reason == deploymentTimedOut {
			return c
		}
	}
	return nil
}

// warningReasons are the reasons worth a Warning event when a condition
// takes one of them.
var warningReasons = map[string]bool{
	v1alpha1.ReasonResourceConflict:         true,
	v1alpha1.ReasonSecretNotFound:           true,
	v1alpha1.ReasonInvalidDatabaseURL:       true,
	v1alpha1.ReasonConnectionFailed:         true,
	v1alpha1.ReasonTableNotUsable:           true,
	v1alpha1.ReasonStatementRefused:         true,
	v1alpha1.ReasonQueryFailed:              true,
	v1alpha1.ReasonProgressDeadlineExceeded: true,
	v1alpha1.ReasonPoisonedRows:             true,
}

// warningOrder is the order in which conditions are considered for a
// warning: the most specific first, so that a missing Secret's event is
// DatabaseReachable's, which names the Secret the outbox needs.
var warningOrder = []v1alpha1.ConditionType{
	v1alpha1.ConditionDatabaseReachable, v1alpha1.ConditionReady, v1alpha1.ConditionDegraded,
	v1alpha1.ConditionProgressing, v1alpha1.ConditionStalled, v1alpha1.ConditionReconciling,
}

// Warnings are the conditions that have just taken a warning reason, one
// per reason: a missing Secret makes both Ready and DatabaseReachable
// False, and is one event.
func Warnings(before, after []metav1.Condition) []metav1.Condition {
	seen := map[string]bool{}
	var out []metav1.Condition
	for _, t := range warningOrder {
		c := meta.FindStatusCondition(after, string(t))
		if c == nil {
			continue
		}
		if !warningReasons[c.Reason] || seen[c.Reason] {
			continue
		}
		seen[c.Reason] = true
		if prev := meta.FindStatusCondition(before, c.Type); prev == nil || prev.Reason != c.Reason {
			out = append(out, *c)
		}
	}
	return out
}
