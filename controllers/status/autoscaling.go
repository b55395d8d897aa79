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
// starts from the running drainers, within the bounds. read is the
// latest successful read of the outbox, nil before the first: without
// one, the count only follows a change of the bounds. now is when a
// change of the count is recorded.
//
// Each read recommends a count (see recommend). The count is the highest
// recommendation of the last scaleDownStabilization, so a higher one
// takes effect at once and a lower one only when every higher one has
// left the window. The window's recommendations are kept as a
// decreasing list: a recommendation hides every earlier one that is not
// higher, since it outlives them in the window.
//
// A read is taken once: the last recommendation's time is the last
// read's, at the second's precision of the status. running is the
// fleet's pod count, which a new autoscaling starts from.
func Autoscale(spec v1alpha1.Autoscaling, prev *v1alpha1.AutoscalingStatus, running int32, read *Reading, now time.Time) *v1alpha1.AutoscalingStatus {
	lowest, highest := ptr.Deref(spec.MinReplicas, 1), spec.MaxReplicas
	var next *v1alpha1.AutoscalingStatus
	if prev != nil {
		next = prev.DeepCopy()
	} else {
		next = &v1alpha1.AutoscalingStatus{
			DesiredReplicas: running,
			Reason:          fmt.Sprintf("started from the %d running drainers; the outbox has not been read yet", running),
		}
	}
	before := next.DesiredReplicas
	at := metav1.Time{}
	if read != nil {
		at = metav1.NewTime(read.Time.Truncate(time.Second))
	}
	if recs := next.Recommendations; read != nil && (len(recs) == 0 || !recs[len(recs)-1].Time.Equal(&at)) {
		want, why := recommend(spec, running, *read)
		recs := next.Recommendations
		for len(recs) > 0 && recs[len(recs)-1].Replicas <= want {
			recs = recs[:len(recs)-1]
		}
		recs = append(recs, v1alpha1.Recommendation{Replicas: want, Time: at})
		horizon := at.Add(-spec.ScaleDownStabilization.Duration)
		for len(recs) > 1 && recs[0].Time.Time.Before(horizon) {
			recs = recs[1:]
		}
		next.Recommendations = recs
		next.DesiredReplicas = recs[0].Replicas
		next.Reason = why
		if hold := recs[0]; hold.Replicas > want {
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
