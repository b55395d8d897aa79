package status

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/outbox"
)

var _ = Describe("An OutboxReplay's status", func() {
	started := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	replay := func(action v1alpha1.ReplayAction, dryRun bool) *v1alpha1.OutboxReplay {
		return &v1alpha1.OutboxReplay{
			ObjectMeta: metav1.ObjectMeta{Generation: 1},
			Spec:       v1alpha1.OutboxReplaySpec{Action: action, DryRun: dryRun, Selector: v1alpha1.RowSelector{Limit: 1000}},
		}
	}
	ran := func(change outbox.PoisonedChange) ReplayRun {
		return ReplayRun{Generation: 1, Started: started, Now: started.Add(1500 * time.Millisecond), Table: "public.outbox", MaxAttempts: 10,
			Change: change}
	}
	conditionOf := func(s *v1alpha1.OutboxReplayStatus, t v1alpha1.ConditionType) metav1.Condition {
		c := meta.FindStatusCondition(s.Conditions, string(t))
		Expect(c).NotTo(BeNil(), string(t))
		return *c
	}

	It("records a replay carried out: what matched, what changed, when, and Complete, each condition at the generation acted on", func() {
		r := replay(v1alpha1.ReplayActionReplay, false)
		s := NextReplayStatus(r, ran(outbox.PoisonedChange{Matched: 3, Counted: true, Changed: 3, IDs: []string{"a", "b", "c"}}))
		Expect(s.Matched).To(Equal(ptr.To(int64(3))))
		Expect(s.Changed).To(Equal(ptr.To(int64(3))))
		Expect(s.RowIDs).To(Equal([]string{"a", "b", "c"}))
		Expect(s.Table).To(Equal("public.outbox"))
		Expect(s.MaxAttempts).To(Equal(int32(10)))
		Expect(s.StartTime.Time).To(Equal(started))
		Expect(s.CompletionTime.Time).To(Equal(started.Add(time.Second)))
		Expect(conditionOf(s, v1alpha1.ReplayComplete)).To(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "RowsReplayed"),
			HaveField("Message", "Replayed 3 of 3 matched rows of public.outbox"), HaveField("ObservedGeneration", int64(1))))
		Expect(conditionOf(s, v1alpha1.ReplayFailed)).To(And(HaveField("Status", metav1.ConditionFalse), HaveField("ObservedGeneration", int64(1))))
		r.Status = *s
		Expect(ReplayDone(r.Status)).To(BeTrue())
	})

	It("says how many matched rows were left alone, and what a dry run and an empty match did", func() {
		s := NextReplayStatus(replay(v1alpha1.ReplayActionPark, false), ran(outbox.PoisonedChange{Matched: 5, Counted: true, Changed: 4}))
		Expect(conditionOf(s, v1alpha1.ReplayComplete)).To(And(HaveField("Reason", "RowsParked"), HaveField("Message",
			"Parked 4 of 5 matched rows of public.outbox; the other 1 were locked, leased or changed by others meanwhile, and left alone")))
		s = NextReplayStatus(replay(v1alpha1.ReplayActionPark, true), ran(outbox.PoisonedChange{Matched: 5, Counted: true, IDs: []string{"a"}}))
		Expect(s.Changed).To(Equal(ptr.To(int64(0))), "shown as 0, not blank")
		Expect(s.RowIDs).To(Equal([]string{"a"}))
		Expect(conditionOf(s, v1alpha1.ReplayComplete)).To(And(HaveField("Reason", "DryRun"),
			HaveField("Message", "Dry run: 5 rows of public.outbox match and would be parked; nothing changed")))
		s = NextReplayStatus(replay(v1alpha1.ReplayActionReplay, false), ran(outbox.PoisonedChange{Counted: true}))
		Expect(conditionOf(s, v1alpha1.ReplayComplete)).To(HaveField("Message", "No row of public.outbox matched the selector; nothing changed"))
	})

	It("keeps the first count and adds up what runs changed when a change goes on over several runs, recording at most 100 ids", func() {
		r := replay(v1alpha1.ReplayActionReplay, false)
		first := ran(outbox.PoisonedChange{Matched: 250, Counted: true, Changed: 120, IDs: ids(100)})
		first.Reason, first.Message = v1alpha1.ReasonRunning, "120 rows of public.outbox changed in this run of 5m0s; going on"
		r.Status = *NextReplayStatus(r, first)
		Expect(ReplayDone(r.Status)).To(BeFalse())
		Expect(r.Status.CompletionTime).To(BeNil())
		Expect(conditionOf(&r.Status, v1alpha1.ReplayComplete)).To(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "Running")))

		broken := ran(outbox.PoisonedChange{Matched: 130, Counted: true, Changed: 30, IDs: []string{"late"}})
		broken.Reason, broken.Message = v1alpha1.ReasonQueryFailed, "canceling statement due to statement timeout"
		broken.Started = started.Add(time.Hour)
		running := r.Status.DeepCopy().Conditions
		Expect(ReplayWarning(nil, running)).To(BeNil(), "going on is no warning")
		r.Status = *NextReplayStatus(r, broken)
		Expect(ReplayWarning(running, r.Status.Conditions)).To(HaveField("Reason", "QueryFailed"), "worth a warning")
		unreachable := ReplayRun{Generation: 1, Reason: v1alpha1.ReasonConnectionFailed, Message: "Connect to postgres://app:xxxxx@db/app: refused"}
		r.Status = *NextReplayStatus(r, unreachable)
		Expect(ReplayDone(r.Status)).To(BeFalse())

		last := ran(outbox.PoisonedChange{Matched: 100, Counted: true, Changed: 100})
		r.Status = *NextReplayStatus(r, last)
		Expect(r.Status.Matched).To(Equal(ptr.To(int64(250))), "what the selector matched when the change began")
		Expect(r.Status.Changed).To(Equal(ptr.To(int64(250))))
		Expect(r.Status.StartTime.Time).To(Equal(started), "when it first ran")
		Expect(r.Status.RowIDs).To(HaveLen(100))
		Expect(conditionOf(&r.Status, v1alpha1.ReplayComplete)).To(HaveField("Message", "Replayed 250 of 250 matched rows of public.outbox"))
	})

	It("fails for good on an invalid selector, and warns once per reason", func() {
		r := replay(v1alpha1.ReplayActionReplay, false)
		run := ReplayRun{Generation: 1, Reason: v1alpha1.ReasonInvalidSelector,
			Message: `spec.selector.ids[0]: Invalid value: "x": must be a UUID, as the id column is uuid`}
		s := NextReplayStatus(r, run)
		Expect(conditionOf(s, v1alpha1.ReplayFailed)).To(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "InvalidSelector"),
			HaveField("Message", ContainSubstring("create another OutboxReplay"))))
		Expect(s.Matched).To(BeNil(), "nothing was counted")
		Expect(ReplayWarning(nil, s.Conditions)).To(HaveField("Reason", "InvalidSelector"))
		Expect(ReplayWarning(s.Conditions, s.Conditions)).To(BeNil(), "the same reason again is no news")
		r.Status = *s
		Expect(ReplayDone(r.Status)).To(BeTrue())
	})
})

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprint(i)
	}
	return out
}
