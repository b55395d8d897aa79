package e2e

import (
	"context"
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/test/testenv"
)

// english prints numbers as the operator's events do: 200,000.
var english = message.NewPrinter(language.English)

const (
	warehouse = "warehouse"
	// autoscaleEvents at autoscaleTarget a drainer ask for 8 drainers, more
	// than autoscaleMax.
	autoscaleEvents   = 200_000
	autoscaleTarget   = 25_000
	autoscaleMax      = 4
	autoscaleInterval = time.Second
	autoscaleWindow   = 30 * time.Second
)

// describeAutoscaling is the journey's autoscaled fleet: a second sample
// fleet, in a namespace of its own, that runs no pods while idle, grows to
// maxReplicas within a status interval of a backlog, and shrinks back to
// zero once the backlog is drained and the stabilization window is over.
func describeAutoscaling() {
	Describe("a fleet sized by its backlog", func() {
		It("scales from zero to 4 drainers within a status interval of 200,000 events, drains them, and is back to zero after the stabilization window", func(ctx SpecContext) {
			namespace(ctx, warehouse)
			outbox := testenv.Outbox{DB: services.DB, Table: "public." + testenv.UniqueName("autoscaled_outbox")}
			Expect(outbox.Migrate(ctx)).To(Succeed())
			DeferCleanup(func(ctx SpecContext) {
				_, err := services.DB.Exec(ctx, "DROP TABLE IF EXISTS "+outbox.Table)
				Expect(err).NotTo(HaveOccurred())
			})
			ch, err := services.Broker.Channel()
			Expect(err).NotTo(HaveOccurred())
			topology, err := testenv.DeclareTopology(ch, "#", nil)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() { topology.Delete(ch); ch.Close() })
			ledger, err := testenv.StartLedger(services.Broker, topology.Queue)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(ledger.Stop)

			manifests, err := testenv.SampleFleet(outbox.Table, topology.Exchange, autoscaleInterval.String(), func(spec map[string]any) {
				delete(spec, "replicas")
				spec["autoscaling"] = map[string]any{
					"minReplicas": int64(0), "maxReplicas": int64(autoscaleMax), "targetBacklogPerReplica": int64(autoscaleTarget),
					"scaleDownStabilization": autoscaleWindow.String(),
				}
			})
			Expect(err).NotTo(HaveOccurred())
			out, err := runWithInput(manifests, "kubectl", "apply", "--namespace", warehouse, "-f", "-")
			Expect(err).NotTo(HaveOccurred(), out)
			DeferCleanup(func(ctx SpecContext) {
				mustRun("kubectl", "delete", "outboxdrainer", fleetName, "--namespace", warehouse)
				Eventually(func() int { return len(pods(ctx, warehouse, drainerLabels)) }, 2*time.Minute).Should(BeZero())
			})
			od := &v1alpha1.OutboxDrainer{}
			key := client.ObjectKey{Namespace: warehouse, Name: fleetName}
			desired := func() int32 {
				if err := k8s.Get(ctx, key, od); err != nil || od.Status.Autoscaling == nil {
					return -1
				}
				return od.Status.Autoscaling.DesiredReplicas
			}
			Eventually(func(g Gomega) {
				g.Expect(desired()).To(BeZero())
				g.Expect(od.Status.LastProbeTime).NotTo(BeNil())
			}, time.Minute).Should(Succeed())
			Expect(pods(ctx, warehouse, drainerLabels)).To(BeEmpty(), "an idle fleet runs no pods")

			timeline := testenv.NewTimeline()
			watch := watchScaling(ctx, timeline, key)
			ids, err := outbox.Insert(ctx, autoscaleEvents)
			Expect(err).NotTo(HaveOccurred())
			committed := timeline.Mark("%d events committed in one transaction", len(ids))

			Eventually(desired, 30*time.Second, 20*time.Millisecond).Should(BeEquivalentTo(autoscaleMax))
			scaledUp := timeline.Mark("status.autoscaling.desiredReplicas %d: %s", autoscaleMax, od.Status.Autoscaling.Reason) - committed
			Eventually(func() []string { return readyPods(ctx, warehouse, drainerLabels) }, 2*time.Minute, 100*time.Millisecond).
				Should(HaveLen(autoscaleMax))
			timeline.Mark("%d drainer pods Ready", autoscaleMax)

			Eventually(func() (int, error) { return ledger.Missing(ids) }, 10*time.Minute, time.Second).Should(BeZero())
			drained := timeline.Mark("all %d events in the queue", len(ids))
			Eventually(func() int32 { return desired() }, autoscaleWindow+2*time.Minute, 100*time.Millisecond).Should(BeZero())
			scaledDownAt := time.Now()
			scaledDown := timeline.Mark("status.autoscaling.desiredReplicas 0: %s", od.Status.Autoscaling.Reason)
			Eventually(func() int { return len(pods(ctx, warehouse, drainerLabels)) }, 2*time.Minute, 100*time.Millisecond).Should(BeZero())
			timeline.Mark("no drainer pods")
			watch.stop()
			lastBacklog := watch.lastBacklogRead()
			Expect(lastBacklog).NotTo(BeZero(), "no status with a backlog was seen")

			lost, duplicates := ledger.Account(ids)
			report := fmt.Sprintf("%d events: scaled 0 → %d %.1fs after their commit (status interval %s); drained %.1fs after the commit; "+
				"scaled to 0 %.1fs after the drain and %.1fs after the last read that saw a backlog (scaleDownStabilization %s); lost %d, duplicates %d\n%s",
				len(ids), autoscaleMax, scaledUp.Seconds(), autoscaleInterval, (drained - committed).Seconds(),
				(scaledDown - drained).Seconds(), scaledDownAt.Sub(lastBacklog).Seconds(), autoscaleWindow, len(lost), duplicates, timeline)
			AddReportEntry("autoscaling", report)
			fmt.Fprint(GinkgoWriter, report)
			Expect(lost).To(BeEmpty())
			// The read that first found the backlog sized the fleet in the
			// same status write, with no interval lost in between.
			Expect(watch.desiredAtFirstBacklog()).To(BeEquivalentTo(autoscaleMax), report)
			// A read that finds the backlog, its reconcile, and the status
			// write: within one status interval of the commit, give or take
			// the read's own duration on a busy machine.
			Expect(scaledUp).To(BeNumerically("<=", autoscaleInterval+2*time.Second), report)
			// The window counts from the last read that saw a backlog, not
			// from the queue's last delivery, which the ledger may take in
			// later than the drainers settled it.
			Expect(scaledDownAt.Sub(lastBacklog)).To(BeNumerically(">=", autoscaleWindow),
				"not before the window since the last read that saw a backlog:\n%s", report)
			Expect(eventsOf(ctx, warehouse, fleetName)).To(ContainElements(
				english.Sprintf("Scaled: Scaled from 0 to %d: backlog %d at %d per replica wants 8, capped at maxReplicas %d",
					autoscaleMax, autoscaleEvents, autoscaleTarget, autoscaleMax),
				MatchRegexp(`^Scaled: Scaled from \d to 0: backlog 0 at 25,000 per replica wants 0$`),
			))
		})
	})
}

// scalingWatch marks on a timeline each change of a fleet's desired and
// Ready drainers and its backlog, and keeps the time of the last read of
// the outbox that saw a backlog: the time the stabilization window counts
// from.
type scalingWatch struct {
	stop func()
	mu   sync.Mutex
	// lastBacklog is the status's lastProbeTime of the last read seen with
	// a backlog, at the status's second precision.
	lastBacklog time.Time
	// firstBacklog is the first status seen with a backlog, nil before it.
	firstBacklog *v1alpha1.OutboxDrainerStatus
}

// watchScaling reads the fleet's status every 100 ms, more often than the
// status interval, so no read's backlog is missed, until stop is called.
func watchScaling(ctx context.Context, timeline *testenv.Timeline, key client.ObjectKey) *scalingWatch {
	w := &scalingWatch{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		var seen string
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			od := &v1alpha1.OutboxDrainer{}
			if err := k8s.Get(ctx, key, od); err != nil {
				timeline.Mark("read the OutboxDrainer: %v", err)
				continue
			}
			desired, backlog := "-", "-"
			if a := od.Status.Autoscaling; a != nil {
				desired = fmt.Sprint(a.DesiredReplicas)
			}
			if b := od.Status.Backlog; b != nil {
				backlog = english.Sprint(*b)
				if *b > 0 && od.Status.LastProbeTime != nil {
					w.mu.Lock()
					w.lastBacklog = od.Status.LastProbeTime.Time
					if w.firstBacklog == nil {
						w.firstBacklog = od.Status.DeepCopy()
					}
					w.mu.Unlock()
				}
			}
			if now := fmt.Sprintf("desired %s  ready %d  backlog %s", desired, od.Status.ReadyReplicas, backlog); now != seen {
				timeline.Mark("%s", now)
				seen = now
			}
		}
	})
	w.stop = func() { close(done); wg.Wait() }
	return w
}

// lastBacklogRead is when the last read seen with a backlog was made.
func (w *scalingWatch) lastBacklogRead() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastBacklog
}

// desiredAtFirstBacklog is the desired replicas of the first status seen
// with a backlog, -1 if none was seen or it had no autoscaling status.
func (w *scalingWatch) desiredAtFirstBacklog() int32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.firstBacklog == nil || w.firstBacklog.Autoscaling == nil {
		return -1
	}
	return w.firstBacklog.Autoscaling.DesiredReplicas
}
