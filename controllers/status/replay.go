package status

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/outbox"
)

// ReplayRun is what one reconcile of an OutboxReplay found and did.
type ReplayRun struct {
	Generation int64
	// Reason is "" when the change ran to its end. Otherwise it is why it
	// did not, with a Message: the OutboxDrainer missing, a database
	// reason, ReasonRunning when a long change stopped at the end of its
	// run to go on in the next, or ReasonInvalidSelector.
	Reason, Message string
	// Started is when this run began, Now when it ended.
	Started, Now time.Time
	// Table and MaxAttempts are what the change ran on, once known.
	Table       string
	MaxAttempts int32
	// Change is what this run did, in part when Reason is set.
	Change outbox.PoisonedChange
}

// maxRecordedIDs is how many row ids an OutboxReplay's status keeps.
const maxRecordedIDs = outbox.MaxRecordedIDs

// ReplayDone reports whether an OutboxReplay was carried out, or failed for
// good: either way it never runs again.
func ReplayDone(s v1alpha1.OutboxReplayStatus) bool {
	return meta.IsStatusConditionTrue(s.Conditions, string(v1alpha1.ReplayComplete)) ||
		meta.IsStatusConditionTrue(s.Conditions, string(v1alpha1.ReplayFailed))
}

// NextReplayStatus adds a run to what the OutboxReplay's status already
// records: the first count of matched rows stays, rows changed add up
// across runs (a change cut short goes on where it stopped), and the
// conditions say where it stands.
func NextReplayStatus(r *v1alpha1.OutboxReplay, run ReplayRun) *v1alpha1.OutboxReplayStatus {
	next := r.Status.DeepCopy()
	next.ObservedGeneration = run.Generation
	if run.Table != "" {
		next.Table, next.MaxAttempts = run.Table, run.MaxAttempts
	}
	c := run.Change
	if c.Counted {
		if next.StartTime == nil {
			next.StartTime = ptr.To(metav1.NewTime(run.Started.Truncate(time.Second)))
		}
		if next.Matched == nil {
			next.Matched = ptr.To(c.Matched)
		}
		next.Changed = ptr.To(ptr.Deref(next.Changed, 0) + c.Changed)
	}
	for _, id := range c.IDs {
		if len(next.RowIDs) < maxRecordedIDs {
			next.RowIDs = append(next.RowIDs, id)
		}
	}

	cond := func(t v1alpha1.ConditionType, s metav1.ConditionStatus, reason, message string) {
		meta.SetStatusCondition(&next.Conditions, condition(t, s, run.Generation, reason, message))
	}
	switch run.Reason {
	case "":
		next.CompletionTime = ptr.To(metav1.NewTime(run.Now.Truncate(time.Second)))
		reason, message := completion(r.Spec, next)
		cond(v1alpha1.ReplayComplete, metav1.ConditionTrue, reason, message)
		cond(v1alpha1.ReplayFailed, metav1.ConditionFalse, v1alpha1.ReasonAsExpected, "")
	case v1alpha1.ReasonInvalidSelector:
		cond(v1alpha1.ReplayComplete, metav1.ConditionFalse, run.Reason, run.Message)
		cond(v1alpha1.ReplayFailed, metav1.ConditionTrue, run.Reason,
			run.Message+"; the spec is immutable: create another OutboxReplay")
	default:
		cond(v1alpha1.ReplayComplete, metav1.ConditionFalse, run.Reason, run.Message)
		cond(v1alpha1.ReplayFailed, metav1.ConditionFalse, v1alpha1.ReasonAsExpected, "")
	}
	return next
}

// completion is the Complete condition's reason and message for a change
// carried out: what it did, to how many of the rows it matched.
func completion(spec v1alpha1.OutboxReplaySpec, s *v1alpha1.OutboxReplayStatus) (reason, message string) {
	matched, changed := ptr.Deref(s.Matched, 0), ptr.Deref(s.Changed, 0)
	verb, reason := "Replayed", v1alpha1.ReasonRowsReplayed
	if spec.Action == v1alpha1.ReplayActionPark {
		verb, reason = "Parked", v1alpha1.ReasonRowsParked
	}
	switch {
	case spec.DryRun:
		return v1alpha1.ReasonDryRun, fmt.Sprintf("Dry run: %d rows of %s match and would be %s; nothing changed",
			matched, s.Table, spec.Action+"ed")
	case matched == 0 && changed == 0:
		return reason, fmt.Sprintf("No row of %s matched the selector; nothing changed", s.Table)
	case changed < matched:
		return reason, fmt.Sprintf("%s %d of %d matched rows of %s; the other %d were locked, leased or changed by others meanwhile, and left alone",
			verb, changed, matched, s.Table, matched-changed)
	}
	return reason, fmt.Sprintf("%s %d of %d matched rows of %s", verb, changed, matched, s.Table)
}

// ReplayWarning is the Complete condition when it has just taken a reason
// worth a Warning event: the change cannot go on for now, or for good.
func ReplayWarning(before, after []metav1.Condition) *metav1.Condition {
	c := meta.FindStatusCondition(after, string(v1alpha1.ReplayComplete))
	if c == nil || c.Status == metav1.ConditionTrue || c.Reason == v1alpha1.ReasonRunning {
		return nil
	}
	if prev := meta.FindStatusCondition(before, c.Type); prev != nil && prev.Reason == c.Reason {
		return nil
	}
	return c
}
