package drainer

import (
	"os"
	"runtime/debug"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("The drainer's garbage collection", func() {
	// gcPercent reads the runtime's target without changing it.
	gcPercent := func() int {
		p := debug.SetGCPercent(-1)
		debug.SetGCPercent(p)
		return p
	}
	BeforeEach(func() {
		was, gogc, set := gcPercent(), os.Getenv("GOGC"), os.Getenv("GOGC") != ""
		limit := debug.SetMemoryLimit(-1) // TuneGC may set one from this process's cgroup
		DeferCleanup(func() {
			debug.SetGCPercent(was)
			debug.SetMemoryLimit(limit)
			if set {
				Expect(os.Setenv("GOGC", gogc)).To(Succeed())
			} else {
				Expect(os.Unsetenv("GOGC")).To(Succeed())
			}
		})
	})

	It("lets the heap grow to five times what is live when GOGC is not set", func() {
		Expect(os.Unsetenv("GOGC")).To(Succeed())
		debug.SetGCPercent(100)
		percent, _ := TuneGC()
		Expect(percent).To(Equal(400))
		Expect(gcPercent()).To(Equal(400))
	})

	It("keeps what GOGC asks for", func() {
		// The runtime reads GOGC as the process starts.
		Expect(os.Setenv("GOGC", "150")).To(Succeed())
		debug.SetGCPercent(150)
		percent, _ := TuneGC()
		Expect(percent).To(Equal(150))
		Expect(gcPercent()).To(Equal(150))
	})
})
