package brokerfaults

import (
	"time"

	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/faultwatch"
	"github.com/spillway-io/spillway/test/rabbitcluster"
)

// watchDrainer samples the drainer while a fault runs, with its broker
// gauges, counting its log lines about the broker.
func watchDrainer(d drainer) *faultwatch.Watch {
	return faultwatch.Start(faultwatch.Target{Addr: d.addr, Logs: d.session.Err.Contents, LogTopic: "roker",
		Gauges: []string{"spillway_drainer_broker_blocked", "spillway_drainer_broker_connected"}})
}

// movedFrom waits until the drainer is connected to a node other than
// node, and marks which.
func movedFrom(w *faultwatch.Watch, d drainer, node int) {
	var now int
	Eventually(func() int { now = rabbitcluster.ConnectedNode(d.id); return now }, time.Minute, 200*time.Millisecond).
		Should(And(Not(BeZero()), Not(Equal(node))), "the drainer moved to another node")
	w.Timeline.Mark("connected to %s", rabbitcluster.NodeName(now))
}

// readyz is the drainer's readiness: its status code and body.
func readyz(addr string) string { return faultwatch.Readyz(addr) }
