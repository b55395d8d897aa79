package drainer

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("the pipeline's window", func() {
	It("gives entries back oldest first while it reuses its array, and lets go of those it gave back", func() {
		var w window
		batches := make([]*batch, 40)
		for i := range batches {
			batches[i] = &batch{}
		}
		var got []int
		next := 0
		// Pushes outpace pops, then pops catch up: the array fills at the
		// back while its front is free, which is when entries move down.
		for _, step := range []struct{ push, pop int }{{5, 2}, {6, 3}, {9, 4}, {12, 10}, {8, 21}} {
			for range step.push {
				w.push(inflight{batch: batches[next], index: next})
				next++
			}
			for range step.pop {
				Expect(w.oldest().index).To(Equal(len(got)))
				got = append(got, w.pop().index)
			}
		}
		Expect(w.len()).To(Equal(0))
		want := make([]int, next)
		for i := range want {
			want[i] = i
		}
		Expect(got).To(Equal(want))
		for _, e := range w.entries[:cap(w.entries)] {
			Expect(e.batch).To(BeNil(), "a popped entry still holds its batch")
		}
	})
})
