package status

import (
	"fmt"
	"math"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

// Reading is what one read of the outbox tells autoscaling.
type Reading struct {
	// Backlog is the pending rows that are not poisoned: poisoned rows wait
	// for a replay, and more drainers would not publish them.
	Backlog int64
	// OldestPendingAge is meaningful only when AgeKnown.
	OldestPendingAge time.Duration
	AgeKnown         bool
	// Time is when the read was made.
	Time time.Time
}

// Autoscale is the autoscaling status after one reconcile. prev is the
// status so far, nil when autoscaling was just turned on: the fleet then
// starts from running, its pod count, within the bounds. read is the
// latest successful read of the outbox, nil before the first: without
// one, the count only follows a change of the bounds. now is when a
// change of the count is recorded.
//
// Each read recommends a count (see recommend). The count is the highest
// recommendation of the last scaleDownStabilization, so a higher one
// takes effect at once and a lower one only when every higher one has
// left the window. A read is taken once, however many reconciles see it:
// the last recommendation's time is the last read's, at the second's
// precision of the status.
func Autoscale(spec v1alpha1.Autoscaling, prev *v1alpha1.AutoscalingStatus, running int32, read *Reading, now time.Time) *v1alpha1.AutoscalingStatus {
	next := &v1alpha1.AutoscalingStatus{
		DesiredReplicas: running,
		Reason:          fmt.Sprintf("started from the %d running drainers; the outbox has not been read yet", running),
	}
	if prev != nil {
		next = prev.DeepCopy()
	}
	before := next.DesiredReplicas
	lowest, highest := ptr.Deref(spec.MinReplicas, 1), spec.MaxReplicas
	if read != nil && !taken(next.Recommendations, read.Time) {
		want, why := recommend(spec, running, *read)
		if !atFloor(next.Recommendations, want, lowest) {
			next.Recommendations = push(next.Recommendations, v1alpha1.Recommendation{Replicas: want, Time: metav1.NewTime(read.Time.Truncate(time.Second))},
				spec.ScaleDownStabilization.Duration)
		}
		hold := next.Recommendations[0]
		next.DesiredReplicas, next.Reason = hold.Replicas, why
		if hold.Replicas > want {
			next.Reason += fmt.Sprintf("; held at %d until %s by the recommendation of %s (scaleDownStabilization %s)",
				hold.Replicas, hold.Time.Add(spec.ScaleDownStabilization.Duration).UTC().Format(time.RFC3339),
				hold.Time.UTC().Format(time.RFC3339), spec.ScaleDownStabilization.Duration)
		}
	}
	// The bounds may have changed since the window's recommendations.
	switch {
	case next.DesiredReplicas > highest:
		next.DesiredReplicas = highest
		next.Reason += fmt.Sprintf("; capped at maxReplicas %d", highest)
	case next.DesiredReplicas < lowest:
		next.DesiredReplicas = lowest
		next.Reason += fmt.Sprintf("; raised to minReplicas %d", lowest)
	}
	if next.DesiredReplicas != before {
		next.LastScaleTime = ptr.To(metav1.NewTime(now.Truncate(time.Second)))
	}
	return next
}

// taken says whether the read made at t is the window's last.
func taken(window []v1alpha1.Recommendation, t time.Time) bool {
	return len(window) > 0 && window[len(window)-1].Time.Equal(ptr.To(metav1.NewTime(t.Truncate(time.Second))))
}

// atFloor says a recommendation of want would only re-date the window's one
// recommendation, of the same count, at the lowest the bounds allow. Nothing
// lower can follow it, so its time decides nothing, and leaving it spares an
// idle fleet a status write at every read.
func atFloor(window []v1alpha1.Recommendation, want, lowest int32) bool {
	return len(window) == 1 && window[0].Replicas == want && want <= lowest
}

// push adds a recommendation to the window and drops the ones that can no
// longer decide the count: those older than the window, and those not
// higher than a later one, which outlives them in it. What is left
// decreases, so its first is the window's highest.
func push(window []v1alpha1.Recommendation, r v1alpha1.Recommendation, length time.Duration) []v1alpha1.Recommendation {
	for len(window) > 0 && window[len(window)-1].Replicas <= r.Replicas {
		window = window[:len(window)-1]
	}
	window = append(window, r)
	horizon := r.Time.Add(-length)
	for len(window) > 1 && window[0].Time.Time.Before(horizon) {
		window = window[1:]
	}
	return window
}

// recommend is the count one read asks for, within the bounds, and why:
// enough drainers for the backlog at targetBacklogPerReplica each and,
// with targetOldestPendingAge, the running drainers scaled by how far the
// oldest row's age is above or below the target, as an HPA scales by a
// metric's ratio to its target. The larger wins. An empty backlog asks
// for none.
func recommend(spec v1alpha1.Autoscaling, running int32, r Reading) (int32, string) {
	p := message.NewPrinter(language.English)
	target := spec.TargetBacklogPerReplica
	want := ceilDiv(r.Backlog, target)
	why := p.Sprintf("backlog %d at %d per replica wants %d", r.Backlog, target, want)
	if age := spec.TargetOldestPendingAge; age != nil && r.AgeKnown && r.Backlog > 0 {
		base := int64(max(running, 1))
		byAge := int64(min(math.Ceil(float64(base)*r.OldestPendingAge.Seconds()/age.Duration.Seconds()), math.MaxInt32))
		if byAge > want {
			want = byAge
			why = p.Sprintf("oldest pending row %s old against a target of %s wants %d (%d × %s / %s)",
				r.OldestPendingAge.Round(time.Second), age.Duration, want, base, r.OldestPendingAge.Round(time.Second), age.Duration)
		}
	}
	lowest, highest := int64(ptr.Deref(spec.MinReplicas, 1)), int64(spec.MaxReplicas)
	switch {
	case want > highest:
		why += fmt.Sprintf(", capped at maxReplicas %d", highest)
		want = highest
	case want < lowest:
		why += fmt.Sprintf(", raised to minReplicas %d", lowest)
		want = lowest
	}
	return int32(want), why
}

// ceilDiv is ⌈n / d⌉ for n ≥ 0 and d > 0, saturating rather than
// overflowing.
func ceilDiv(n, d int64) int64 {
	if n <= 0 {
		return 0
	}
	q := n / d
	if n%d != 0 {
		q++
	}
	return min(q, math.MaxInt32)
}

// ScaleEvent is the note of the event that a change of the count records,
// or "" when the count did not change.
func ScaleEvent(before int32, after *v1alpha1.AutoscalingStatus) string {
	if after.DesiredReplicas == before {
		return ""
	}
	return fmt.Sprintf("Scaled from %d to %d: %s", before, after.DesiredReplicas, after.Reason)
}
