package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/test/testenv"
)

// Each fault runs against a fleet draining a burst of events while an
// application keeps writing more.
const (
	faultBurst   = 20_000
	faultTraffic = 300 // events a second
)

// fault is one fault's run and what it cost.
type fault struct {
	name     string
	timeline *testenv.Timeline
	injected time.Duration // since the timeline's start
	events   int
	lost     []string
	dups     int
	recovery time.Duration // from the injection to a drained backlog
	// released is how long after the injection a victim's claimed events
	// were published, where a fault measures it.
	released time.Duration
	notes    []string
}

// inject marks the moment the fault is injected.
func (f *fault) inject(format string, args ...any) {
	f.injected = f.timeline.Mark(format, args...)
}

// note adds a finding to the fault's report and its timeline.
func (f *fault) note(format string, args ...any) {
	f.notes = append(f.notes, fmt.Sprintf(format, args...))
	f.timeline.Mark(format, args...)
}

// runFault writes a burst of events and a steady flow, waits until the
// fleet drains, runs inject (which injects the fault and returns once its
// effect is over), stops the flow, and waits until the backlog is 0 and
// every event is accounted for in the queue by message_id.
func runFault(ctx context.Context, name string, outbox testenv.Outbox, ledger *testenv.Ledger, inject func(context.Context, *fault)) *fault {
	f := &fault{name: name, timeline: testenv.NewTimeline()}
	traffic := testenv.StartTraffic(outbox, faultTraffic)
	stopped := false
	defer func() {
		if !stopped {
			_, _ = traffic.Stop()
		}
	}()
	burst, err := outbox.Insert(ctx, faultBurst)
	Expect(err).NotTo(HaveOccurred())
	f.timeline.Mark("%d events written at once, %d/s flowing", len(burst), faultTraffic)
	// Inject mid-drain: once the fleet is publishing the burst.
	before := ledger.Total()
	Eventually(func() (int, error) { return ledger.Total() - before, ledger.Err() }, time.Minute, 20*time.Millisecond).Should(BeNumerically(">=", faultBurst/10),
		func() string {
			backlog, err := outbox.Backlog(ctx)
			return fmt.Sprintf("the fleet is not publishing the burst (backlog %d, %v):\n%s", backlog, err, f.timeline)
		})

	inject(ctx, f)

	flowed, err := traffic.Stop()
	stopped = true
	if err != nil {
		// The application's own outage, as in a database failover: what it
		// wrote is what committed, and only that is accounted for.
		f.note("the application's writes failed for a while: %v", err)
	}
	f.timeline.Mark("flow stopped after %d events", len(flowed))
	f.account(ctx, outbox, ledger, append(burst, flowed...))
	return f
}

// account waits until the backlog is 0 and every event written is in the
// queue, and records the fault's recovery, its lost events and duplicates.
func (f *fault) account(ctx context.Context, outbox testenv.Outbox, ledger *testenv.Ledger, all []string) {
	_, err := outbox.WaitDrained(ctx, 3*time.Minute)
	Expect(err).NotTo(HaveOccurred(), f.timeline.String())
	f.recovery = f.timeline.Mark("backlog 0") - f.injected
	f.events = len(all)
	Eventually(func() (int, error) { return ledger.Missing(all) }, time.Minute, 100*time.Millisecond).Should(BeZero(),
		"events missing from the queue:\n%s", f.timeline)
	f.lost, f.dups = ledger.Account(all)
	f.timeline.Mark("all %d events in the queue: %d lost, %d duplicates", f.events, len(f.lost), f.dups)
}

// faultLog is the suite's report of every fault.
type faultLog []*fault

func (l faultLog) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-58s %7s %5s %11s %14s\n", "fault", "events", "lost", "duplicates", "drained again")
	for _, f := range l {
		fmt.Fprintf(&b, "%-58s %7d %5d %11d %13.1fs\n", f.name, f.events, len(f.lost), f.dups, f.recovery.Seconds())
		for _, n := range f.notes {
			fmt.Fprintf(&b, "    %s\n", n)
		}
	}
	b.WriteString("\n")
	for _, f := range l {
		fmt.Fprintf(&b, "%s:\n%s\n", f.name, f.timeline)
	}
	return b.String()
}

// drainerWithClaims waits until a Ready drainer pod holds claims on pending
// events, and returns it and the ids it holds: the victim of a fault.
func drainerWithClaims(ctx context.Context, outbox testenv.Outbox) (string, []string) {
	var victim string
	var ids []string
	Eventually(func(g Gomega) {
		claims, err := outbox.Claims(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		for _, name := range readyPods(ctx, shop, drainerLabels) {
			if claims[name] > 0 {
				victim = name
			}
		}
		g.Expect(victim).NotTo(BeEmpty(), "a Ready drainer holding claims; claims now: %v", claims)
		ids, err = outbox.ClaimedBy(ctx, victim)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(ids).NotTo(BeEmpty())
	}, time.Minute, 10*time.Millisecond).Should(Succeed())
	return victim, ids
}

// waitPublished waits until every event a victim held a claim on is
// published, notes how long that took, and returns it.
func waitPublished(ctx context.Context, f *fault, outbox testenv.Outbox, victim string, ids []string) time.Duration {
	Eventually(func() (int, error) { return outbox.Unpublished(ctx, ids) }, 2*time.Minute, 50*time.Millisecond).Should(BeZero())
	took := f.timeline.Since() - f.injected
	f.note("the %d events %s held claims on were published %.1fs after the fault", len(ids), victim, took.Seconds())
	return took
}

// eventsOf lists the events about an OutboxDrainer, as "Reason: note".
func eventsOf(ctx context.Context, namespace, name string) []string {
	var list eventsv1.EventList
	Expect(k8s.List(ctx, &list, client.InNamespace(namespace))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "OutboxDrainer" && e.Regarding.Name == name {
			out = append(out, e.Reason+": "+e.Note)
		}
	}
	return out
}

// waitGone waits until a pod is gone from the API server.
func waitGone(ctx context.Context, f *fault, pod string) {
	Eventually(func() bool {
		_, err := getPod(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: shop, Name: pod}})
		return apierrors.IsNotFound(err)
	}, 2*time.Minute, 100*time.Millisecond).Should(BeTrue())
	f.timeline.Mark("pod %s gone from the API server", pod)
}

// waitDrainers waits until the fleet is exactly n Ready drainer pods, none
// of them terminating.
func waitDrainers(ctx context.Context, f *fault, n int) {
	var names []string
	Eventually(func(g Gomega) {
		list := pods(ctx, shop, drainerLabels)
		g.Expect(list).To(HaveLen(n))
		names = nil
		for _, p := range list {
			g.Expect(ready(p)).To(BeTrue(), "pod %s", p.Name)
			names = append(names, p.Name)
		}
	}, 3*time.Minute, 100*time.Millisecond).Should(Succeed())
	f.timeline.Mark("%d drainer pods Ready: %s", n, strings.Join(names, ", "))
}

// rabbitmqctl runs the local RabbitMQ's control tool.
func rabbitmqctl(args ...string) (string, error) {
	out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
	GinkgoWriter.Printf("$ rabbitmqctl %s\n%s\n", strings.Join(args, " "), out)
	return string(out), err
}

func mustRabbitmqctl(args ...string) string {
	out, err := rabbitmqctl(args...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), out)
	return out
}

// brokerConnection is a connection of a drainer to RabbitMQ.
type brokerConnection struct {
	pid, user, name string
}

// drainerConnections lists the RabbitMQ connections of the given drainer
// pods, which name each connection spillway-drainer/<pod>.
func drainerConnections(drainers []string) []brokerConnection {
	out := mustRabbitmqctl("list_connections", "--quiet", "--no-table-headers", "pid", "user", "client_properties")
	var conns []brokerConnection
	for _, line := range strings.Split(out, "\n") {
		fields := strings.SplitN(line, "\t", 3)
		if len(fields) < 3 {
			continue
		}
		name := connectionName.FindStringSubmatch(fields[2])
		if name == nil {
			continue
		}
		for _, d := range drainers {
			if name[1] == "spillway-drainer/"+d {
				conns = append(conns, brokerConnection{pid: fields[0], user: fields[1], name: name[1]})
			}
		}
	}
	return conns
}

// connectionName finds the client-provided name among the client
// properties, as rabbitmqctl prints them: {"connection_name","…"}.
var connectionName = regexp.MustCompile(`\{"connection_name","([^"]*)"\}`)
