// Package faultwatch watches a drainer process while a fault suite injects
// a fault: it samples the drainer's published count, its gauges, its
// /readyz and, where given, what the operator's read of the outbox says,
// puts every change on the fault's timeline, and turns it all into the
// fault's report, printed with the others in one table after the suite.
package faultwatch

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/testenv"
)

// Target is what a Watch samples.
type Target struct {
	// Addr is the drainer's metrics and probes address.
	Addr string
	// Gauges are the drainer's gauges whose changes go on the timeline.
	Gauges []string
	// Logs returns what the drainer has logged so far; LogTopic picks the
	// lines to count, by a word of their message.
	Logs     func() []byte
	LogTopic string
	// Status, if set, reads the outbox as the operator does, and returns
	// what the OutboxDrainer's status would say; it is sampled every
	// second, as a read costs the database more than a scrape.
	Status func() string
}

// Watch samples a drainer every 100 ms while a fault runs. What /readyz
// said while unready is what the drainer reported; what Status said other
// than the backlog is what the fleet's status reported.
type Watch struct {
	t        Target
	Timeline *testenv.Timeline

	mu sync.Mutex
	// faultAt is when the fault was injected; publishes are the times the
	// published count was seen to grow.
	faultAt    time.Time
	publishes  []time.Time
	said       []string
	statusSaid []string
	done       chan struct{}
	stopped    chan struct{}
}

// Start watches t until Stop.
func Start(t Target) *Watch {
	w := &Watch{t: t, Timeline: testenv.NewTimeline(), done: make(chan struct{}), stopped: make(chan struct{})}
	go w.run()
	return w
}

// Fault marks the fault's injection, and each of its later steps.
func (w *Watch) Fault(what string) {
	w.mu.Lock()
	if w.faultAt.IsZero() {
		w.faultAt = time.Now()
	}
	w.mu.Unlock()
	w.Timeline.Mark("%s", what)
}

func (w *Watch) run() {
	defer close(w.stopped)
	published := -1.0
	gauges := map[string]float64{}
	lastReady, lastStatus := "", ""
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ticks := 0; ; ticks++ {
		select {
		case <-w.done:
			return
		case <-tick.C:
		}
		if n, err := testenv.Metric(w.t.Addr, "spillway_drainer_published_rows_total"); err == nil && n != published {
			if published >= 0 && n > published {
				w.mu.Lock()
				w.publishes = append(w.publishes, time.Now())
				w.mu.Unlock()
			}
			published = n
		}
		for _, g := range w.t.Gauges {
			if v, err := testenv.Metric(w.t.Addr, g); err == nil {
				if old, seen := gauges[g]; !seen || old != v {
					gauges[g] = v
					w.Timeline.Mark("%s %g", g, v)
				}
			}
		}
		if ready := Readyz(w.t.Addr); ready != lastReady {
			lastReady = ready
			w.Timeline.Mark("/readyz %s", ready)
			if !strings.HasPrefix(ready, "200") && ready != "unreachable" { // not yet listening
				w.mu.Lock()
				w.said = append(w.said, ready)
				w.mu.Unlock()
			}
		}
		if w.t.Status == nil || ticks%10 != 0 {
			continue
		}
		if status := w.t.Status(); status != lastStatus {
			lastStatus = status
			if !strings.HasPrefix(status, "backlog") {
				w.Timeline.Mark("status: %s", status)
				w.mu.Lock()
				w.statusSaid = append(w.statusSaid, status)
				w.mu.Unlock()
			}
		}
	}
}

// Readyz is the drainer's readiness: its status code and body.
func Readyz(addr string) string {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return "unreachable"
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return strings.TrimSpace(resp.Status[:3] + " " + strings.TrimSpace(string(body)))
}

// Stop ends the sampling.
func (w *Watch) Stop() {
	close(w.done)
	<-w.stopped
}

// LongestPause is the longest time after the fault's injection in which
// nothing was published: how long the drainer took to recover.
func (w *Watch) LongestPause() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	longest, last := time.Duration(0), w.faultAt
	for _, at := range w.publishes {
		if at.Before(w.faultAt) {
			continue
		}
		longest, last = max(longest, at.Sub(last)), at
	}
	return longest
}

// Logged counts the drainer's log lines on the topic, by message, in the
// order they first came.
func (w *Watch) Logged() string {
	var order []string
	count := map[string]int{}
	for _, line := range strings.Split(string(w.t.Logs()), "\n") {
		var entry struct{ Msg string }
		if json.Unmarshal([]byte(line), &entry) != nil || !strings.Contains(entry.Msg, w.t.LogTopic) {
			continue
		}
		if count[entry.Msg]++; count[entry.Msg] == 1 {
			order = append(order, entry.Msg)
		}
	}
	shown := make([]string, len(order))
	for i, msg := range order {
		shown[i] = fmt.Sprintf("%q ×%d", msg, count[msg])
	}
	return strings.Join(shown, ", ")
}

// Reported is what /readyz said while the drainer was unready, each answer
// once, in order.
func (w *Watch) Reported() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return distinct(w.said, "stayed ready")
}

// StatusReported is what the status read said other than the backlog.
func (w *Watch) StatusReported() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return distinct(w.statusSaid, "read the backlog throughout")
}

func distinct(said []string, none string) string {
	var out []string
	seen := map[string]bool{}
	for _, s := range said {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return none
	}
	return strings.Join(out, "; ")
}

// Report is one fault's figures.
type Report struct {
	Fault        string
	Events, Lost int
	Duplicates   int
	Recovery     time.Duration
	Reported     string
	Status       string
	Logged       string
	Timeline     *testenv.Timeline
}

// Of fills a report's figures from what w saw.
func (w *Watch) Of(fault string, events, lost, duplicates int) Report {
	r := Report{Fault: fault, Events: events, Lost: lost, Duplicates: duplicates, Recovery: w.LongestPause(),
		Reported: w.Reported(), Logged: w.Logged(), Timeline: w.Timeline}
	if w.t.Status != nil {
		r.Status = w.StatusReported()
	}
	return r
}

// Reports are a suite's faults' figures, printed together after it.
type Reports struct {
	mu  sync.Mutex
	all []Report
}

// Record prints the fault's figures and timeline, keeps them for the
// suite's table, and fails the spec if an event was lost.
func (rs *Reports) Record(r Report) {
	status := ""
	if r.Status != "" {
		status = "\nthe status read said: " + r.Status
	}
	ginkgo.AddReportEntry(r.Fault, fmt.Sprintf("events %d, lost %d, duplicates %d, longest pause in publishing %.1fs\n/readyz said: %s%s\nlogged: %s\n%s",
		r.Events, r.Lost, r.Duplicates, r.Recovery.Seconds(), r.Reported, status, r.Logged, r.Timeline))
	rs.mu.Lock()
	rs.all = append(rs.all, r)
	rs.mu.Unlock()
	gomega.Expect(r.Lost).To(gomega.BeZero(), "events lost")
}

// Print writes the table of every recorded fault to stdout.
func (rs *Reports) Print() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if len(rs.all) == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-48s %7s %5s %5s %9s  %s\n", "fault", "events", "lost", "dups", "recovery", "what the drainer reported")
	for _, f := range rs.all {
		fmt.Fprintf(&b, "%-48s %7d %5d %5d %8.1fs  %s\n", f.Fault, f.Events, f.Lost, f.Duplicates, f.Recovery.Seconds(), oneLine(f.Reported))
		if f.Status != "" {
			fmt.Fprintf(&b, "%-48s %7s %5s %5s %9s  status: %s\n", "", "", "", "", "", oneLine(f.Status))
		}
	}
	fmt.Fprint(os.Stdout, b.String())
}

// oneLine fits what a drainer said into a row of the table: pgx's connect
// errors span a line per host.
func oneLine(s string) string { return secret.Truncate(strings.Join(strings.Fields(s), " "), 120) }
