package drainer

import (
	"os"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
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
		percent, _ := TuneGC(DefaultConfig())
		Expect(percent).To(Equal(400))
		Expect(gcPercent()).To(Equal(400))
	})

	It("keeps what GOGC asks for", func() {
		// The runtime reads GOGC as the process starts.
		Expect(os.Setenv("GOGC", "150")).To(Succeed())
		debug.SetGCPercent(150)
		percent, _ := TuneGC(DefaultConfig())
		Expect(percent).To(Equal(150))
		Expect(gcPercent()).To(Equal(150))
	})

	It("keeps its heap near four times what the byte budgets let it hold, where the container sets no limit", func() {
		Expect(budgetMemory(DefaultConfig())).To(Equal(int64(128 << 20)))
		cfg := DefaultConfig()
		cfg.MaxClaimBytes, cfg.MaxPipelineBytes = 32<<20, 64<<20
		Expect(budgetMemory(cfg)).To(Equal(int64(512 << 20)))
		for _, name := range []string{"GOMEMLIMIT", "AUTOMEMLIMIT"} {
			if v, set := os.LookupEnv(name); set {
				Expect(os.Unsetenv(name)).To(Succeed())
				DeferCleanup(os.Setenv, name, v)
			}
		}
		// Nine tenths of the container's limit where it has one, of the
		// budgets' otherwise.
		want := int64(0.9 * float64(budgetMemory(DefaultConfig())))
		if container, err := memlimit.FromCgroup(); err == nil {
			want = int64(0.9 * float64(container))
		}
		_, limit := TuneGC(DefaultConfig())
		Expect(limit).To(Equal(want))
		Expect(debug.SetMemoryLimit(-1)).To(Equal(limit), "the runtime's soft limit")
	})
})
