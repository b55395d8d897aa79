package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	amqp "github.com/rabbitmq/amqp091-go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/test/rabbitcluster"
	"github.com/spillway-io/spillway/test/testenv"
)

// depot is the namespace of the fleet on the RabbitMQ cluster.
const depot = "depot"

// describeBrokerCluster is the journey's fleet on a RabbitMQ cluster: the
// sample fleet in a namespace of its own, whose broker Secret lists the
// three nodes of hack/rabbitmq-cluster.sh, publishing to a quorum queue.
// A second fleet drains over TLS, with the CA from a Secret. Then the node
// a drainer pod is connected to is killed, then a memory alarm
// blocks the cluster; each fault prints the OutboxDrainer's Ready condition
// as it changed, and accounts for every event by message_id.
func describeBrokerCluster(env *journey) {
	Describe("a fleet on a RabbitMQ cluster with a quorum queue", Ordered, func() {
		var (
			outbox testenv.Outbox
			topo   testenv.Topology
		)
		BeforeAll(func(ctx SpecContext) {
			if missing := rabbitcluster.Missing(); missing != "" {
				if rabbitcluster.InCI() {
					Fail(missing)
				}
				Skip(missing)
			}
			_, err := rabbitcluster.Script("start")
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() { _, _ = rabbitcluster.Script("stop") })
			namespace(ctx, depot)
			outbox, topo = clusterFleet(ctx, depot, rabbitcluster.URLs())
		})

		// clusterFault runs a fault on the fleet under a burst and a steady
		// flow, prints the Ready condition as it changed, and accounts for
		// every event in the quorum queue.
		clusterFault := func(ctx context.Context, name string, inject func(context.Context, *fault)) {
			f := &fault{name: name, timeline: testenv.NewTimeline()}
			traffic := testenv.StartTraffic(outbox, faultTraffic)
			burst, err := outbox.Insert(ctx, faultBurst)
			Expect(err).NotTo(HaveOccurred())
			f.timeline.Mark("%d events written at once, %d/s flowing", len(burst), faultTraffic)
			Eventually(func() (int, error) { return outbox.Backlog(ctx) }, time.Minute, 20*time.Millisecond).Should(BeNumerically("<", faultBurst*9/10))
			ready := watchReady(ctx, f.timeline, client.ObjectKey{Namespace: depot, Name: fleetName})

			inject(ctx, f)

			flowed, err := traffic.Stop()
			Expect(err).NotTo(HaveOccurred())
			all := append(burst, flowed...)
			_, err = outbox.WaitDrained(ctx, 3*time.Minute)
			Expect(err).NotTo(HaveOccurred(), f.timeline.String())
			f.recovery = f.timeline.Mark("backlog 0") - f.injected
			ready.stop()
			f.events = len(all)
			onCluster(func(ch *amqp.Channel) {
				var err error
				f.lost, f.dups, err = rabbitcluster.Account(ch, topo.Queue, all)
				Expect(err).NotTo(HaveOccurred())
			})
			f.timeline.Mark("all %d events accounted for in the quorum queue: %d lost, %d duplicates", f.events, len(f.lost), f.dups)
			f.notes = append(f.notes, "Ready condition: "+ready.seen())
			env.faults = append(env.faults, f)
			AddReportEntry(name, fmt.Sprintf("%d events, %d lost, %d duplicates\n%s", f.events, len(f.lost), f.dups, f.timeline))
			Expect(f.lost).To(BeEmpty(), "events lost:\n%s", f.timeline)
		}

		It("drains over TLS from the image: the drainers verify the nodes' certificates with a CA mounted from a Secret", func(ctx SpecContext) {
			ns := namespace(ctx, "depot-tls")
			ca, err := os.ReadFile(rabbitcluster.CAFile())
			Expect(err).NotTo(HaveOccurred())
			Expect(k8s.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "broker-ca", Namespace: ns},
				Data:       map[string][]byte{"ca.crt": ca},
			})).To(Succeed())
			tlsOutbox, tlsTopo := clusterFleet(ctx, ns, rabbitcluster.TLSURLs(), func(spec map[string]any) {
				spec["broker"].(map[string]any)["tls"] = map[string]any{"secretName": "broker-ca"}
			})
			for _, p := range pods(ctx, ns, drainerLabels) {
				Expect(p.Status.ContainerStatuses[0].ImageID).To(Equal(spillwayImage), "the registry's image, by digest")
				sc := p.Spec.Containers[0].SecurityContext
				Expect(*sc.ReadOnlyRootFilesystem && *sc.RunAsNonRoot).To(BeTrue(), "a read-only root, as a non-root user")
			}

			ids, err := tlsOutbox.Insert(ctx, 2000)
			Expect(err).NotTo(HaveOccurred())
			_, err = tlsOutbox.WaitDrained(ctx, 2*time.Minute)
			Expect(err).NotTo(HaveOccurred())
			onCluster(func(ch *amqp.Channel) {
				lost, dups, err := rabbitcluster.Account(ch, tlsTopo.Queue, ids)
				Expect(err).NotTo(HaveOccurred())
				AddReportEntry("over TLS", fmt.Sprintf("%d events, %d lost, %d duplicates", len(ids), len(lost), dups))
				Expect(lost).To(BeEmpty())
			})
		})

		It("loses no event when the node a drainer pod is connected to is killed with kill -9", func(ctx SpecContext) {
			clusterFault(ctx, "broker node of a drainer pod killed (kill -9)", func(ctx context.Context, f *fault) {
				victim := readyPods(ctx, depot, drainerLabels)[0]
				var node int
				Eventually(func() int { node = rabbitcluster.ConnectedNode(victim); return node }, 30*time.Second, 200*time.Millisecond).ShouldNot(BeZero())
				_, err := rabbitcluster.Script("kill-node", strconv.Itoa(node))
				Expect(err).NotTo(HaveOccurred())
				f.inject("kill -9 of %s, the node of drainer pod %s", rabbitcluster.NodeName(node), victim)
				DeferCleanup(func() { _, _ = rabbitcluster.Script("start-node", strconv.Itoa(node)) })
				Eventually(func() int { return rabbitcluster.ConnectedNode(victim) }, time.Minute, 200*time.Millisecond).
					Should(And(Not(BeZero()), Not(Equal(node))))
				f.note("%s reconnected to %s", victim, rabbitcluster.NodeName(rabbitcluster.ConnectedNode(victim)))
			})
		})

		It("shows a memory alarm in the Ready condition as BrokerBlocked, and loses no event", func(ctx SpecContext) {
			clusterFault(ctx, "memory alarm on a broker node, 20 s", func(ctx context.Context, f *fault) {
				watermark, err := rabbitcluster.Ctl(2, "eval", "vm_memory_monitor:get_vm_memory_high_watermark().")
				Expect(err).NotTo(HaveOccurred())
				_, err = rabbitcluster.Ctl(2, "set_vm_memory_high_watermark", "0.0000001")
				Expect(err).NotTo(HaveOccurred())
				f.inject("memory alarm on %s", rabbitcluster.NodeName(2))
				DeferCleanup(func() { _, _ = rabbitcluster.Ctl(2, "set_vm_memory_high_watermark", watermark) })
				key := client.ObjectKey{Namespace: depot, Name: fleetName}
				Eventually(func() string { return readyOf(ctx, key).Reason }, time.Minute, 200*time.Millisecond).
					Should(Equal(v1alpha1.ReasonBrokerBlocked))
				f.note("Ready %s: %s", readyOf(ctx, key).Reason, readyOf(ctx, key).Message)
				time.Sleep(20*time.Second - (f.timeline.Since() - f.injected)) // the alarm lasts 20 s
				_, err = rabbitcluster.Ctl(2, "set_vm_memory_high_watermark", watermark)
				Expect(err).NotTo(HaveOccurred())
				f.timeline.Mark("alarm cleared")
				Eventually(func() metav1.ConditionStatus { return readyOf(ctx, key).Status }, 2*time.Minute, 200*time.Millisecond).
					Should(Equal(metav1.ConditionTrue))
			})
		})
	})
}

// readyOf is the Ready condition of the fleet at key, or an empty one.
func readyOf(ctx context.Context, key client.ObjectKey) metav1.Condition {
	od := &v1alpha1.OutboxDrainer{}
	if err := k8s.Get(ctx, key, od); err != nil {
		return metav1.Condition{}
	}
	if c := meta.FindStatusCondition(od.Status.Conditions, string(v1alpha1.ConditionReady)); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// readyWatch records each change of a fleet's Ready condition.
type readyWatch struct {
	mu   sync.Mutex
	all  []string
	done chan struct{}
	left chan struct{}
}

func watchReady(ctx context.Context, timeline *testenv.Timeline, key client.ObjectKey) *readyWatch {
	w := &readyWatch{done: make(chan struct{}), left: make(chan struct{})}
	go func() {
		defer close(w.left)
		last := ""
		for {
			select {
			case <-w.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			c := readyOf(ctx, key)
			if c.Type == "" {
				continue
			}
			now := fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
			if now != last {
				last = now
				timeline.Mark("Ready %s", now)
				w.mu.Lock()
				w.all = append(w.all, c.Reason)
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *readyWatch) stop() {
	close(w.done)
	<-w.left
}

// seen lists the Ready reasons in the order they came.
func (w *readyWatch) seen() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.all, " → ")
}

// onCluster runs fn on a channel of a fresh connection to the first node of
// the broker cluster that answers.
// clusterFleet is the sample fleet in namespace ns on the broker cluster's
// urls, with an outbox table and a quorum queue of its own, its two drainer
// pods Ready; all of it goes at cleanup.
func clusterFleet(ctx context.Context, ns, urls string, edits ...func(spec map[string]any)) (testenv.Outbox, testenv.Topology) {
	outbox := testenv.Outbox{DB: services.DB, Table: "public." + testenv.UniqueName("cluster_outbox")}
	Expect(outbox.Migrate(ctx)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		_, err := services.DB.Exec(ctx, "DROP TABLE IF EXISTS "+outbox.Table)
		Expect(err).NotTo(HaveOccurred())
	})
	var topo testenv.Topology
	onCluster(func(ch *amqp.Channel) {
		var err error
		topo, err = testenv.DeclareTopology(ch, "#", amqp.Table{"x-queue-type": "quorum"})
		Expect(err).NotTo(HaveOccurred())
	})
	DeferCleanup(func() { onCluster(topo.Delete) })

	manifests, err := testenv.SampleFleet(outbox.Table, topo.Exchange, "1s", edits...)
	Expect(err).NotTo(HaveOccurred())
	manifests = strings.Replace(manifests, testenv.BrokerURL(), urls, 1)
	out, err := runWithInput(manifests, "kubectl", "apply", "--namespace", ns, "-f", "-")
	Expect(err).NotTo(HaveOccurred(), out)
	DeferCleanup(func(ctx SpecContext) {
		mustRun("kubectl", "delete", "outboxdrainer", fleetName, "--namespace", ns)
		Eventually(func() int { return len(pods(ctx, ns, drainerLabels)) }, 2*time.Minute).Should(BeZero())
	})
	Eventually(func() []string { return readyPods(ctx, ns, drainerLabels) }, 2*time.Minute, 200*time.Millisecond).Should(HaveLen(2))
	return outbox, topo
}

func onCluster(fn func(ch *amqp.Channel)) {
	Expect(rabbitcluster.WithChannel(fn)).To(Succeed())
}
