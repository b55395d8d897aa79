package brokerfaults

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/rabbitcluster"
	"github.com/spillway-io/spillway/test/testenv"
)

// watch samples a drainer every 100 ms while a fault runs: its published
// count, its /readyz and its broker gauges. Each change goes on the
// fault's timeline; what /readyz said while unready is what the drainer
// reported.
type watch struct {
	d        drainer
	timeline *testenv.Timeline

	mu sync.Mutex
	// faultAt is when the fault was injected; publishes are the times the
	// published count was seen to grow.
	faultAt   time.Time
	publishes []time.Time
	said      []string
	done      chan struct{}
	stopped   chan struct{}
}

func watchDrainer(d drainer) *watch {
	w := &watch{d: d, timeline: testenv.NewTimeline(), done: make(chan struct{}), stopped: make(chan struct{})}
	go w.run()
	return w
}

// fault marks the fault's injection, and each of its later steps.
func (w *watch) fault(what string) {
	w.mu.Lock()
	if w.faultAt.IsZero() {
		w.faultAt = time.Now()
	}
	w.mu.Unlock()
	w.timeline.Mark("%s", what)
}

// movedFrom waits until the drainer is connected to a node other than
// node, and marks which.
func (w *watch) movedFrom(node int) {
	var now int
	Eventually(func() int { now = rabbitcluster.ConnectedNode(w.d.id); return now }, time.Minute, 200*time.Millisecond).
		Should(And(Not(BeZero()), Not(Equal(node))), "the drainer moved to another node")
	w.timeline.Mark("connected to %s", rabbitcluster.NodeName(now))
}

func (w *watch) run() {
	defer close(w.stopped)
	var published, blocked, connected float64 = -1, -1, -1
	lastReady := ""
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-tick.C:
		}
		if n, err := testenv.Metric(w.d.addr, "spillway_drainer_published_rows_total"); err == nil && n != published {
			if published >= 0 && n > published {
				w.mu.Lock()
				w.publishes = append(w.publishes, time.Now())
				w.mu.Unlock()
			}
			published = n
		}
		if b, err := testenv.Metric(w.d.addr, "spillway_drainer_broker_blocked"); err == nil && b != blocked {
			blocked = b
			w.timeline.Mark("spillway_drainer_broker_blocked %g", b)
		}
		if c, err := testenv.Metric(w.d.addr, "spillway_drainer_broker_connected"); err == nil && c != connected {
			connected = c
			w.timeline.Mark("spillway_drainer_broker_connected %g", c)
		}
		if ready := readyz(w.d.addr); ready != lastReady {
			lastReady = ready
			w.timeline.Mark("/readyz %s", ready)
			if !strings.HasPrefix(ready, "200") && ready != "unreachable" { // not yet listening
				w.mu.Lock()
				w.said = append(w.said, ready)
				w.mu.Unlock()
			}
		}
	}
}

// readyz is the drainer's readiness: its status code and body.
func readyz(addr string) string {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return "unreachable"
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return strings.TrimSpace(resp.Status[:3] + " " + strings.TrimSpace(string(body)))
}

func (w *watch) stop() {
	close(w.done)
	<-w.stopped
}

// longestPause is the longest time after the fault's injection in which
// nothing was published: how long the drainer took to recover.
func (w *watch) longestPause() time.Duration {
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

// logged counts the drainer's log lines about its broker connection, by
// message, in the order they first came.
func (w *watch) logged() string {
	var order []string
	count := map[string]int{}
	for _, line := range strings.Split(string(w.d.session.Err.Contents()), "\n") {
		var entry struct{ Msg string }
		if json.Unmarshal([]byte(line), &entry) != nil || !strings.Contains(entry.Msg, "roker") {
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

// reported is what /readyz said while the drainer was unready, each
// answer once, in order.
func (w *watch) reported() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var distinct []string
	seen := map[string]bool{}
	for _, s := range w.said {
		if !seen[s] {
			seen[s] = true
			distinct = append(distinct, s)
		}
	}
	if len(distinct) == 0 {
		return "stayed ready"
	}
	return strings.Join(distinct, "; ")
}
