package drainer

import (
	"math"
	"os"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// drainGCPercent is the drainer's garbage-collection target unless GOGC is
// set: the heap may grow to five times what is live before a collection,
// where Go's default is twice. A drainer's live heap is small (a claim
// ahead, the messages in flight) and its garbage comes with every event: in
// make bench on a fast host, collecting at the default took a fifth of the
// drainer's CPU, and it spent 12–14 µs per event against 10 at 400 (1.95–1.99
// × the raw publisher's, against 1.49–1.51).
const drainGCPercent = 400

// budgetMemory is the soft memory limit where the container sets none: four
// times what the byte budgets let a drainer hold at once (the claim being
// published, one claimed ahead, the pipeline's bytes), 128 MiB at the
// defaults, the drainer's default memory request. Small messages never
// reach it. Large ones make the collector work harder near it, where GOGC's
// headroom alone took a drainer of 4 MB rows to 198 MiB.
func budgetMemory(cfg Config) int64 {
	return 4 * (2*cfg.MaxClaimBytes + cfg.MaxPipelineBytes)
}

// TuneGCPercent sets the drainer's collection target, unless GOGC does, and
// returns it.
func TuneGCPercent() int {
	gcPercent := debug.SetGCPercent(-1)
	if os.Getenv("GOGC") == "" {
		gcPercent = drainGCPercent
	}
	debug.SetGCPercent(gcPercent)
	return gcPercent
}

// TuneGC sets the collection target (TuneGCPercent), and a soft memory limit
// at nine tenths of the container's limit, or of budgetMemory without one,
// unless GOMEMLIMIT or AUTOMEMLIMIT=off says otherwise. It returns both (0:
// no limit), for the start-up log.
func TuneGC(cfg Config) (gcPercent int, memoryLimit int64) {
	gcPercent = TuneGCPercent()
	limits := memlimit.ApplyFallback(memlimit.FromCgroup, memlimit.Limit(uint64(budgetMemory(cfg))))
	if limit, err := memlimit.Set(memlimit.WithProvider(limits)); err == nil && limit < math.MaxInt64 {
		memoryLimit = limit
	}
	return gcPercent, memoryLimit
}
