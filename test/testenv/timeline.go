package testenv

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Timeline records what happened during a fault, each event with the time
// since the fault's start, to print with the fault's report.
type Timeline struct {
	start time.Time
	mu    sync.Mutex
	marks []mark
}

type mark struct {
	at   time.Duration
	what string
}

// NewTimeline starts a timeline now.
func NewTimeline() *Timeline { return &Timeline{start: time.Now()} }

// Mark records an event and returns how long after the start it happened.
func (t *Timeline) Mark(format string, args ...any) time.Duration {
	at := time.Since(t.start)
	t.mu.Lock()
	t.marks = append(t.marks, mark{at: at, what: fmt.Sprintf(format, args...)})
	t.mu.Unlock()
	return at
}

// Since is the time since the start.
func (t *Timeline) Since() time.Duration { return time.Since(t.start) }

// String lists the events, one a line.
func (t *Timeline) String() string {
	var b strings.Builder
	t.Print(&b)
	return b.String()
}

// Print writes the events, one a line.
func (t *Timeline) Print(w io.Writer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range t.marks {
		fmt.Fprintf(w, "%8.1fs  %s\n", m.at.Seconds(), m.what)
	}
}
