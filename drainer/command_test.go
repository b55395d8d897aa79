package drainer

import (
	"log/slog"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("The drainer's JSON log", func() {
	It("prints durations as durations, not integer nanoseconds", func() {
		var out strings.Builder
		slog.New(NewLogHandler(&out)).Warn("Claim failed", "retryIn", 1500*time.Millisecond)
		Expect(out.String()).To(ContainSubstring(`"retryIn":"1.5s"`))
	})
})
