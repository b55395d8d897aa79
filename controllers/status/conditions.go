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
	"github.com/spillway-io/spillway/drainer"
)

// Probe is what one read of the referenced Secrets and the outbox found.
type Probe struct {
	// Reason is ReasonOutboxRead, or why the outbox could not be read.
	Reason string
	// Message never includes a secret.
	Message string
	// MissingSecrets describes each referenced Secret or key that does not
	// exist, the broker's included.
	MissingSecrets []string
	// Outbox is set when the read succeeded.
	Outbox *drainer.OutboxStatus
}

// Fleet is the drainers' Deployment as the reconcile left it.
type Fleet struct {
	Generation      int64
	Paused          bool
	DesiredReplicas int32
	// Deployment is nil when it could not be applied.
	Deployment *appsv1.Deployment
	// ApplyError is the first child object that could not be applied.
	ApplyError error
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
	case f.Paused:
		return notReady(v1alpha1.ReasonPaused, "The fleet is paused and scaled to zero; the outbox is not drained")
	case f.DesiredReplicas == 0:
		return notReady(v1alpha1.ReasonScaledToZero, "The fleet has zero replicas; the outbox is not drained")
	case len(missingSecrets) > 0:
		return notReady(v1alpha1.ReasonSecretNotFound, strings.Join(missingSecrets, "; "))
	case database.Status != metav1.ConditionTrue:
		return notReady(v1alpha1.ReasonDatabaseUnreachable, database.Message)
	case ready < f.DesiredReplicas:
		return notReady(v1alpha1.ReasonReplicasNotReady, fmt.Sprintf("%d of %d drainers are ready", ready, f.DesiredReplicas))
	}
	return condition(v1alpha1.ConditionReady, metav1.ConditionTrue, f.Generation, v1alpha1.ReasonAllReplicasReady,
		fmt.Sprintf("%d of %d drainers are ready", ready, f.DesiredReplicas))
}

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
			fmt.Sprintf("%d rows reached maxAttempts and are not retried until they are replayed", poisoned))
	}
	return condition(v1alpha1.ConditionDegraded, metav1.ConditionFalse, f.Generation, v1alpha1.ReasonAsExpected, "")
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
	v1alpha1.ReasonSecretNotFound:           true,
	v1alpha1.ReasonInvalidDatabaseURL:       true,
	v1alpha1.ReasonConnectionFailed:         true,
	v1alpha1.ReasonTableNotUsable:           true,
	v1alpha1.ReasonQueryFailed:              true,
	v1alpha1.ReasonProgressDeadlineExceeded: true,
	v1alpha1.ReasonPoisonedRows:             true,
}

// Warnings are the conditions that have just taken a warning reason, one
// per reason: a missing Secret makes both Ready and DatabaseReachable
// False, and is one event.
func Warnings(before, after []metav1.Condition) []metav1.Condition {
	seen := map[string]bool{}
	var out []metav1.Condition
	for _, c := range after {
		if !warningReasons[c.Reason] || seen[c.Reason] {
			continue
		}
		seen[c.Reason] = true
		if prev := meta.FindStatusCondition(before, c.Type); prev == nil || prev.Reason != c.Reason {
			out = append(out, c)
		}
	}
	return out
}
