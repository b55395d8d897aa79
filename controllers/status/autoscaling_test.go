package status

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

var _ = Describe("Autoscale", func() {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	spec := func(minReplicas, maxReplicas int32) v1alpha1.Autoscaling {
		return v1alpha1.Autoscaling{
			MinReplicas: ptr.To(minReplicas), MaxReplicas: maxReplicas, TargetBacklogPerReplica: 25_000,
			ScaleDownStabilization: metav1.Duration{Duration: 5 * time.Minute},
		}
	}
	backlog := func(n int64, at time.Time) *Reading { return &Reading{Backlog: n, Time: at} }

	// run feeds reads every 15s from t0, as the operator does, and returns
	// the count after each.
	run := func(s v1alpha1.Autoscaling, running int32, backlogs ...int64) ([]int32, *v1alpha1.AutoscalingStatus) {
		var st *v1alpha1.AutoscalingStatus
		var counts []int32
		for i, b := range backlogs {
			at := t0.Add(time.Duration(i) * 15 * time.Second)
			st = Autoscale(s, st, running, backlog(b, at), at)
			running = st.DesiredReplicas
			counts = append(counts, st.DesiredReplicas)
		}
		return counts, st
	}

	DescribeTable("recommends ⌈backlog / targetBacklogPerReplica⌉ drainers, within minReplicas and maxReplicas",
		func(minReplicas, maxReplicas int32, b int64, want int32, reason string) {
			st := Autoscale(spec(minReplicas, maxReplicas), nil, 1, backlog(b, t0), t0)
			Expect(st.DesiredReplicas).To(Equal(want))
			Expect(st.Reason).To(Equal(reason))
		},
		Entry("an empty backlog with minReplicas 0: none", int32(0), int32(4), int64(0), int32(0),
			"backlog 0 at 25,000 per replica wants 0"),
		Entry("one row wakes a fleet scaled to zero", int32(0), int32(4), int64(1), int32(1),
			"backlog 1 at 25,000 per replica wants 1"),
		Entry("exactly the target: one", int32(0), int32(4), int64(25_000), int32(1),
			"backlog 25,000 at 25,000 per replica wants 1"),
		Entry("one row over the target: two", int32(0), int32(4), int64(25_001), int32(2),
			"backlog 25,001 at 25,000 per replica wants 2"),
		Entry("above maxReplicas: capped", int32(0), int32(4), int64(200_000), int32(4),
			"backlog 200,000 at 25,000 per replica wants 8, capped at maxReplicas 4"),
		Entry("below minReplicas: raised", int32(2), int32(4), int64(10), int32(2),
			"backlog 10 at 25,000 per replica wants 1, raised to minReplicas 2"),
		Entry("a backlog beyond int32 at the smallest target saturates", int32(0), int32(1000), int64(1)<<40, int32(1000),
			"backlog 1,099,511,627,776 at 25,000 per replica wants 43,980,466, capped at maxReplicas 1000"),
	)

	It("scales up at once, on the first read that sees the backlog above the target", func() {
		counts, st := run(spec(1, 4), 1, 0, 120_000)
		Expect(counts).To(Equal([]int32{1, 4}))
		Expect(st.LastScaleTime).To(Equal(ptr.To(metav1.NewTime(t0.Add(15 * time.Second)))))
		Expect(ScaleEvent(1, st)).To(Equal("Scaled from 1 to 4: backlog 120,000 at 25,000 per replica wants 5, capped at maxReplicas 4"))
	})

	It("scales down only once every higher recommendation has left the stabilization window, to the highest left in it", func() {
		// 4 at 0s, 3 at 15s, then 1 from 30s on: 4 holds until 5m after
		// 0s, then 3 until 5m after 15s, then 1.
		backlogs := []int64{100_000, 60_000}
		for range 25 {
			backlogs = append(backlogs, 1_000)
		}
		counts, _ := run(spec(1, 4), 1, backlogs...)
		// Reads at 0s, 15s, …, 390s: index i is at 15i seconds.
		Expect(counts[:21]).To(HaveEach(int32(4)), "within 5m of the recommendation of 4 at 0s")
		Expect(counts[21]).To(Equal(int32(3)), "at 315s the 4 of 0s has left the window, the 3 of 15s has not")
		Expect(counts[22:]).To(HaveEach(int32(1)), "from 330s, 5m after the last higher recommendation")
	})

	It("says what holds the count up, and until when", func() {
		st := Autoscale(spec(0, 4), nil, 4, backlog(100_000, t0), t0)
		st = Autoscale(spec(0, 4), st, 4, backlog(0, t0.Add(time.Minute)), t0.Add(time.Minute))
		Expect(st.DesiredReplicas).To(Equal(int32(4)))
		Expect(st.Reason).To(Equal("backlog 0 at 25,000 per replica wants 0; held at 4 until 2026-12-01T12:05:00Z " +
			"by the recommendation of 2026-12-01T12:00:00Z (scaleDownStabilization 5m0s)"))
		Expect(st.Recommendations).To(Equal([]v1alpha1.Recommendation{
			{Replicas: 4, Time: metav1.NewTime(t0)}, {Replicas: 0, Time: metav1.NewTime(t0.Add(time.Minute))},
		}), "the window keeps only recommendations that can still hold the count up")
	})

	It("scales an idle fleet to zero at minReplicas 0 after the window, and the next backlog scales it up", func() {
		counts, st := run(spec(0, 4), 2, append([]int64{30_000}, make([]int64, 22)...)...)
		Expect(counts[0]).To(Equal(int32(2)))
		Expect(counts[20]).To(Equal(int32(2)), "at 300s the 2 of 0s is still in the window")
		Expect(counts[21]).To(Equal(int32(0)), "at 315s it has left it")
		Expect(ScaleEvent(counts[21], st)).To(BeEmpty(), "no change at the last read")
		at := t0.Add(23 * 15 * time.Second)
		st = Autoscale(spec(0, 4), st, 0, backlog(1, at), at)
		Expect(st.DesiredReplicas).To(Equal(int32(1)))
	})

	It("leaves an idle fleet's status as it was at the lowest count, and still scales it up on the next backlog", func() {
		_, st := run(spec(0, 4), 0, 0, 0)
		idle := st.DeepCopy()
		for i := 2; i < 30; i++ {
			at := t0.Add(time.Duration(i) * 15 * time.Second)
			st = Autoscale(spec(0, 4), st, 0, backlog(0, at), at)
		}
		Expect(st).To(Equal(idle), "reads that recommend the lowest count again change nothing")
		at := t0.Add(30 * 15 * time.Second)
		st = Autoscale(spec(0, 4), st, 0, backlog(30_000, at), at)
		Expect(st.DesiredReplicas).To(Equal(int32(2)))
		Expect(st.Recommendations).To(Equal([]v1alpha1.Recommendation{{Replicas: 2, Time: metav1.NewTime(at)}}))

		_, st = run(spec(2, 4), 2, 10, 10)
		Expect(Autoscale(spec(2, 4), st, 2, backlog(10, t0.Add(time.Hour)), t0.Add(time.Hour))).To(Equal(st), "at minReplicas 2 too")
	})

	It("with no stabilization window, follows every recommendation at once", func() {
		s := spec(0, 4)
		s.ScaleDownStabilization = metav1.Duration{}
		counts, _ := run(s, 1, 100_000, 0, 30_000, 0)
		Expect(counts).To(Equal([]int32{4, 0, 2, 0}))
	})

	It("takes each read once, however many reconciles see it", func() {
		first := Autoscale(spec(0, 4), nil, 1, backlog(60_000, t0), t0)
		again := Autoscale(spec(0, 4), first, 3, backlog(60_000, t0), t0.Add(time.Second))
		Expect(again).To(Equal(first))
	})

	It("keeps the count while reads fail, and until the first read starts from the running drainers", func() {
		st := Autoscale(spec(1, 4), nil, 3, nil, t0)
		Expect(st.DesiredReplicas).To(Equal(int32(3)))
		Expect(st.Reason).To(Equal("started from the 3 running drainers; the outbox has not been read yet"))
		Expect(st.LastScaleTime).To(BeNil())
		Expect(Autoscale(spec(1, 4), st, 3, nil, t0.Add(time.Minute))).To(Equal(st), "no read: no news")
	})

	It("follows lowered bounds at once, without a read", func() {
		st := Autoscale(spec(0, 8), nil, 0, backlog(200_000, t0), t0)
		Expect(st.DesiredReplicas).To(Equal(int32(8)))
		st = Autoscale(spec(0, 3), st, 8, nil, t0.Add(time.Second))
		Expect(st.DesiredReplicas).To(Equal(int32(3)))
		Expect(st.Reason).To(HaveSuffix("; capped at maxReplicas 3"))
		Expect(st.LastScaleTime).To(Equal(ptr.To(metav1.NewTime(t0.Add(time.Second)))))
		Expect(Autoscale(spec(5, 8), st, 3, nil, t0.Add(2*time.Second)).DesiredReplicas).To(Equal(int32(5)))
	})

	Describe("with targetOldestPendingAge", func() {
		aged := func(b int64, age time.Duration, known bool) *Reading {
			return &Reading{Backlog: b, OldestPendingAge: age, AgeKnown: known, Time: t0}
		}
		s := spec(0, 10)
		s.TargetOldestPendingAge = &metav1.Duration{Duration: time.Minute}

		It("scales the running drainers by the age's ratio to its target when that asks for more than the backlog", func() {
			st := Autoscale(s, nil, 2, aged(1_000, 150*time.Second, true), t0)
			Expect(st.DesiredReplicas).To(Equal(int32(5)))
			Expect(st.Reason).To(Equal("oldest pending row 2m30s old against a target of 1m0s wants 5 (2 × 2m30s / 1m0s)"))
		})
		It("leaves the backlog's count when the age is within its target", func() {
			Expect(Autoscale(s, nil, 2, aged(60_000, 30*time.Second, true), t0).DesiredReplicas).To(Equal(int32(3)))
		})
		It("starts a fleet at zero from one drainer's rate", func() {
			Expect(Autoscale(s, nil, 0, aged(10, 3*time.Minute, true), t0).DesiredReplicas).To(Equal(int32(3)))
		})
		It("ignores the age of a table without enqueuedAt, and of an empty backlog", func() {
			Expect(Autoscale(s, nil, 2, aged(10, time.Hour, false), t0).DesiredReplicas).To(Equal(int32(1)))
			Expect(Autoscale(s, nil, 2, aged(0, time.Hour, true), t0).DesiredReplicas).To(Equal(int32(0)))
		})
		It("is capped at maxReplicas however old the row", func() {
			Expect(Autoscale(s, nil, 10, aged(10, 1000*time.Hour, true), t0).DesiredReplicas).To(Equal(int32(10)))
		})
	})
})
