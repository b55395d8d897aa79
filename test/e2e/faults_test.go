package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"
	amqp "github.com/rabbitmq/amqp091-go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/test/testenv"
)

// describeFaults is the journey's faults, each run against the fleet of the
// sample while it drains and an application keeps writing.
func describeFaults(env *journey) {
	Describe("the fleet's faults, each with events flowing", func() {
		var rabbitUsers []string
		AfterAll(func() {
			// After the fleet that used them is gone.
			for _, u := range rabbitUsers {
				_, _ = rabbitmqctl("delete_user", u)
			}
		})
		// check runs a fault and requires that it lost nothing.
		check := func(ctx context.Context, name string, inject func(context.Context, *fault)) *fault {
			f := runFault(ctx, name, env.outbox, env.ledger, inject)
			env.faults = append(env.faults, f)
			Expect(f.lost).To(BeEmpty(), "events lost:\n%s", f.timeline)
			return f
		}

		It("survives a drainer pod deleted mid-drain", func(ctx SpecContext) {
			check(ctx, "drainer pod deleted", func(ctx context.Context, f *fault) {
				victim, claimed := drainerWithClaims(ctx, env.outbox)
				mustRun("kubectl", "delete", "pod", victim, "--namespace", shop, "--wait=false")
				f.inject("kubectl delete pod %s, which held %d claims", victim, len(claimed))
				waitPublished(ctx, f, env.outbox, victim, claimed)
				waitGone(ctx, f, victim)
				waitDrainers(ctx, f, 2)
			})
		})

		It("survives a drainer pod force-deleted mid-drain", func(ctx SpecContext) {
			check(ctx, "drainer pod force-deleted", func(ctx context.Context, f *fault) {
				victim, claimed := drainerWithClaims(ctx, env.outbox)
				mustRun("kubectl", "delete", "pod", victim, "--namespace", shop, "--grace-period=0", "--force")
				f.inject("kubectl delete pod %s --grace-period=0 --force, which held %d claims", victim, len(claimed))
				// The pod is gone from the API at once, but its node, as a
				// kubelet does, still stops its process with SIGTERM and
				// the grace period of its spec: the drainer releases its
				// claims as it stops.
				waitPublished(ctx, f, env.outbox, victim, claimed)
				waitDrainers(ctx, f, 2)
			})
		})

		It("releases at once the claims of a drainer pod force-deleted while its node hangs: with leaseTTL 3m, they are published within a tenth of it", func(ctx SpecContext) {
			// A lease long enough that only the operator's release can
			// explain a quick recovery.
			mustRun("kubectl", "patch", "outboxdrainer", fleetName, "--namespace", shop, "--type=merge", "-p", `{"spec":{"leaseTTL":"3m"}}`)
			Eventually(func(g Gomega) {
				list := pods(ctx, shop, drainerLabels)
				g.Expect(list).To(HaveLen(2))
				for _, p := range list {
					g.Expect(ready(p)).To(BeTrue())
					g.Expect(p.Spec.Containers[0].Args).To(ContainElement("--lease-ttl=3m0s"))
				}
			}, 3*time.Minute, 200*time.Millisecond).Should(Succeed())
			var victim string
			f := check(ctx, "drainer pod force-deleted, its process frozen, leaseTTL 3m", func(ctx context.Context, f *fault) {
				var claimed []string
				victim, claimed = drainerWithClaims(ctx, env.outbox)
				// A hung node: the process runs no more and releases nothing.
				Expect(cluster.Node.Signal(shop, victim, "drainer", syscall.SIGSTOP)).To(Succeed())
				mustRun("kubectl", "delete", "pod", victim, "--namespace", shop, "--grace-period=0", "--force")
				f.inject("%s frozen (SIGSTOP), then force-deleted, holding %d claims", victim, len(claimed))
				// The operator sees the pod gone and releases its claims;
				// the lease alone would hold them for three minutes.
				Eventually(func() (int, error) { claims, err := env.outbox.Claims(ctx); return claims[victim], err },
					time.Minute, 20*time.Millisecond).Should(BeZero())
				f.timeline.Mark("%s holds no claim any more", victim)
				f.released = waitPublished(ctx, f, env.outbox, victim, claimed)
				waitDrainers(ctx, f, 2)
			})
			// The release makes the rows due first; how soon they are all
			// published then depends on how fast the other pods drain (1.9 s
			// in a CI run, 5.3 s with both cores loaded besides), not on the
			// lease, which would hold them for three minutes.
			Expect(f.released).To(BeNumerically("<", 3*time.Minute/10), "the frozen drainer's rows published after the deletion:\n%s", f.timeline)
			Eventually(func() []string { return eventsOf(ctx, shop, fleetName) }, time.Minute).
				Should(ContainElement(MatchRegexp(`^ReleasedClaims: Released \d+ claims of drainer %s: its pod %[1]s is gone$`, victim)))
		})

		It("survives kubectl scale outboxdrainer to 3 replicas, then to 1, mid-drain", func(ctx SpecContext) {
			check(ctx, "scaled to 3, then to 1", func(ctx context.Context, f *fault) {
				mustRun("kubectl", "scale", "outboxdrainer", fleetName, "--namespace", shop, "--replicas=3")
				f.inject("kubectl scale outboxdrainer %s --replicas=3", fleetName)
				waitDrainers(ctx, f, 3)
				Eventually(func() string { _, rows := getOutboxDrainers(shop); return rows[0]["REPLICAS"] }, time.Minute).Should(Equal("3"))
				f.timeline.Mark("kubectl get outboxdrainers shows REPLICAS 3")
				mustRun("kubectl", "scale", "outboxdrainer", fleetName, "--namespace", shop, "--replicas=1")
				f.timeline.Mark("kubectl scale outboxdrainer %s --replicas=1", fleetName)
				waitDrainers(ctx, f, 1)
				mustRun("kubectl", "scale", "outboxdrainer", fleetName, "--namespace", shop, "--replicas=2")
				f.timeline.Mark("kubectl scale outboxdrainer %s --replicas=2", fleetName)
				waitDrainers(ctx, f, 2)
			})
		})

		It("survives a batchSize change mid-drain, which rolls the drainer pods", func(ctx SpecContext) {
			check(ctx, "batchSize changed (rolling update)", func(ctx context.Context, f *fault) {
				before := readyPods(ctx, shop, drainerLabels)
				mustRun("kubectl", "patch", "outboxdrainer", fleetName, "--namespace", shop, "--type=merge", "-p", `{"spec":{"batchSize":250}}`)
				f.inject("kubectl patch outboxdrainer %s: batchSize 500 -> 250", fleetName)
				waitRolledOut(ctx, f, before, "--batch-size=250")
			})
		})

		It("switches to compact message properties mid-drain: the pods roll, and what they publish carries no timestamp, type or app_id", func(ctx SpecContext) {
			Expect(env.ledger.Latest().Type).NotTo(BeEmpty(), "full properties before")
			check(ctx, "messageProperties Full -> Compact (rolling update)", func(ctx context.Context, f *fault) {
				before := readyPods(ctx, shop, drainerLabels)
				mustRun("kubectl", "patch", "outboxdrainer", fleetName, "--namespace", shop, "--type=merge", "-p", `{"spec":{"broker":{"messageProperties":"Compact"}}}`)
				f.inject("kubectl patch outboxdrainer %s: messageProperties Full -> Compact", fleetName)
				waitRolledOut(ctx, f, before, "--message-properties=compact")
				// The old pods are gone: what arrives now, the new ones sent.
				Eventually(func(g Gomega) {
					m := env.ledger.Latest()
					g.Expect(m.MessageId).NotTo(BeEmpty())
					g.Expect(m.ContentType).To(Equal("application/json"))
					g.Expect(m.DeliveryMode).To(Equal(amqp.Persistent))
					g.Expect(m.Timestamp.IsZero()).To(BeTrue())
					g.Expect(m.Type).To(BeEmpty())
					g.Expect(m.AppId).To(BeEmpty())
				}, time.Minute, 50*time.Millisecond).Should(Succeed())
				f.timeline.Mark("the messages arriving carry message_id, content_type and delivery mode only")
			})
		})

		It("keeps no published row once retention.published is patched to 0s mid-drain: the pods roll, and no event is lost", func(ctx SpecContext) {
			var rolled []string
			check(ctx, "retention.published 168h -> 0s (rolling update)", func(ctx context.Context, f *fault) {
				before := readyPods(ctx, shop, drainerLabels)
				mustRun("kubectl", "patch", "outboxdrainer", fleetName, "--namespace", shop, "--type=merge", "-p", `{"spec":{"retention":{"published":"0s"}}}`)
				f.inject("kubectl patch outboxdrainer %s: retention.published 168h -> 0s", fleetName)
				waitRolledOut(ctx, f, before, "--retention-published=0s")
				rolled = readyPods(ctx, shop, drainerLabels)
			})
			// The new pods' settles delete what they publish: not one row
			// marked by them, with no prune needed. Their prune removes the
			// history, and what the old pods marked as they went, within a
			// retention interval.
			published, err := env.outbox.PublishedBy(ctx)
			Expect(err).NotTo(HaveOccurred())
			for _, pod := range rolled {
				Expect(published).NotTo(HaveKey(pod), "rows %s marked published instead of deleting them", pod)
			}
			Eventually(func(g Gomega) {
				published, err := env.outbox.PublishedBy(ctx)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(published).To(BeEmpty())
			}, 3*time.Minute, time.Second).Should(Succeed())
		})

		It("holds the fleet to maxRate while it is set: patched to 150 events/s mid-drain, its two pods publish that together, and drain the rest once it is removed", func(ctx SpecContext) {
			const capped = 150
			check(ctx, "maxRate 150 set, then removed (rolling updates)", func(ctx context.Context, f *fault) {
				before := readyPods(ctx, shop, drainerLabels)
				mustRun("kubectl", "patch", "outboxdrainer", fleetName, "--namespace", shop, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"maxRate":%d}}`, capped))
				f.inject("kubectl patch outboxdrainer %s: maxRate %d, under %d events/s of traffic", fleetName, capped, faultTraffic)
				waitRolledOut(ctx, f, before, fmt.Sprintf("--max-rate=%d", capped))
				// Counted once the two pods are in the table's roster, which
				// is what each counts to take half the cap (and only they:
				// the old pods left it as their sessions ended), and once the
				// ledger has caught up with the queue (the old pods drained at
				// full speed until they stopped); over 15 s, in which the
				// second before the first pod next counts weighs little.
				roster := env.outbox.Spec().RosterOthers()
				Eventually(func() (int, error) {
					var n int
					return n, env.outbox.DB.QueryRow(ctx, roster.SQL, roster.Args...).Scan(&n)
				}, time.Minute, 50*time.Millisecond).Should(Equal(2))
				ch, err := services.Broker.Channel()
				Expect(err).NotTo(HaveOccurred())
				defer ch.Close()
				Eventually(func() (int, error) { return testenv.QueueDepth(ch, env.topology.Queue) }, time.Minute, 50*time.Millisecond).Should(BeZero())
				backlog, err := env.outbox.Backlog(ctx)
				Expect(err).NotTo(HaveOccurred())
				from, start := env.ledger.Total(), time.Now()
				time.Sleep(15 * time.Second)
				rate := float64(env.ledger.Total()-from) / time.Since(start).Seconds()
				f.note("capped at %d/s, the two pods published %.0f/s together", capped, rate)
				Expect(rate).To(BeNumerically("<=", 1.25*capped), "the cap holds for the fleet")
				Expect(rate).To(BeNumerically(">=", 0.5*capped), "and lets it drain")
				Expect(env.outbox.Backlog(ctx)).To(BeNumerically(">", backlog), "the cap, not the traffic, set the pace: the backlog grew")

				before = readyPods(ctx, shop, drainerLabels)
				mustRun("kubectl", "patch", "outboxdrainer", fleetName, "--namespace", shop, "--type=merge", "-p", `{"spec":{"maxRate":null}}`)
				f.timeline.Mark("kubectl patch outboxdrainer %s: maxRate removed", fleetName)
				waitRolledOutWithout(ctx, f, before, "--max-rate")
			})
		})

		It("slows the fleet to its slowest pace while maxCommitLatency is below what any commit takes, and drains the rest once it is removed", func(ctx SpecContext) {
			// Each pod's slowest pace: a claim of a row every 100 ms.
			const slowest = 2 * 10
			check(ctx, "maxCommitLatency 1ns set, then removed (rolling updates)", func(ctx context.Context, f *fault) {
				before := readyPods(ctx, shop, drainerLabels)
				mustRun("kubectl", "patch", "outboxdrainer", fleetName, "--namespace", shop, "--type=merge", "-p", `{"spec":{"maxCommitLatency":"1ns"}}`)
				f.inject("kubectl patch outboxdrainer %s: maxCommitLatency 1ns, under %d events/s of traffic", fleetName, faultTraffic)
				waitRolledOut(ctx, f, before, "--max-commit-latency=1ns")
				// Each pod halves its pace at each timed commit, 300 ms
				// apart, from what it drained in its last second: seconds
				// after it starts, it claims a row at a time.
				window := func() float64 {
					from, start := env.ledger.Total(), time.Now()
					time.Sleep(3 * time.Second)
					return float64(env.ledger.Total()-from) / time.Since(start).Seconds()
				}
				Eventually(window, 2*time.Minute).Should(BeNumerically("<=", 1.5*slowest))
				f.timeline.Mark("the two pods publish at their slowest pace")
				backlog, err := env.outbox.Backlog(ctx)
				Expect(err).NotTo(HaveOccurred())
				from, start := env.ledger.Total(), time.Now()
				time.Sleep(10 * time.Second)
				rate := float64(env.ledger.Total()-from) / time.Since(start).Seconds()
				f.note("every commit slower than 1ns: the two pods published %.1f/s together", rate)
				Expect(rate).To(BeNumerically("<=", 1.5*slowest), "each pod holds to its slowest pace")
				Expect(rate).To(BeNumerically(">", 0), "and still drains, timing its commits")
				Expect(env.outbox.Backlog(ctx)).To(BeNumerically(">", backlog), "the guard, not the traffic, set the pace: the backlog grew")

				before = readyPods(ctx, shop, drainerLabels)
				mustRun("kubectl", "patch", "outboxdrainer", fleetName, "--namespace", shop, "--type=merge", "-p", `{"spec":{"maxCommitLatency":null}}`)
				f.timeline.Mark("kubectl patch outboxdrainer %s: maxCommitLatency removed", fleetName)
				waitRolledOutWithout(ctx, f, before, "--max-commit-latency")
			})
		})

		It("goes on draining while the operator pod is killed, and its status resumes once a new operator pod holds the lease", func(ctx SpecContext) {
			check(ctx, "operator pod killed (frozen, force-deleted)", func(ctx context.Context, f *fault) {
				operators := readyPods(ctx, operatorNamespace, operatorLabels)
				Expect(operators).To(HaveLen(1))
				old := operators[0]
				Expect(holdsLease(ctx, old)).To(BeTrue())
				// As a crashed node would leave it: it renews its lease no
				// more, and does not release it.
				Expect(cluster.Node.Signal(operatorNamespace, old, "manager", syscall.SIGSTOP)).To(Succeed())
				mustRun("kubectl", "delete", "pod", old, "--namespace", operatorNamespace, "--grace-period=0", "--force")
				f.inject("operator pod %s frozen (SIGSTOP) and force-deleted", old)
				published := env.ledger.Total()
				var successor string
				Eventually(func(g Gomega) {
					names := readyPods(ctx, operatorNamespace, operatorLabels)
					g.Expect(names).To(HaveLen(1))
					g.Expect(names[0]).NotTo(Equal(old))
					successor = names[0]
				}, 2*time.Minute, 200*time.Millisecond).Should(Succeed())
				f.timeline.Mark("new operator pod %s Ready", successor)
				Eventually(func() bool { return holdsLease(ctx, successor) }, 2*time.Minute, 200*time.Millisecond).Should(BeTrue())
				leased := time.Now()
				drained := env.ledger.Total() - published
				f.note("%s holds the lease once the frozen one's expired; %d events were published meanwhile, with no operator", successor, drained)
				Expect(drained).To(BeNumerically(">", 0), "the drainers do not need the operator")
				Eventually(func() time.Time {
					od := outboxDrainer(ctx)
					if od.Status.LastProbeTime == nil {
						return time.Time{}
					}
					return od.Status.LastProbeTime.Time
				}, time.Minute, 200*time.Millisecond).Should(BeTemporally(">", leased.Add(time.Second)))
				f.note("the status resumed %.1fs after the new operator pod took the lease", time.Since(leased).Seconds())
			})
		})

		It("respects the PodDisruptionBudget on an eviction through the Eviction API", func(ctx SpecContext) {
			check(ctx, "drainer pod evicted (Eviction API, PDB)", func(ctx context.Context, f *fault) {
				Eventually(func(g Gomega) {
					pdb := &policyv1.PodDisruptionBudget{}
					g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: shop, Name: fleetName}, pdb)).To(Succeed())
					g.Expect(pdb.Status.DisruptionsAllowed).To(BeEquivalentTo(1))
				}, time.Minute).Should(Succeed())
				names := readyPods(ctx, shop, drainerLabels)
				Expect(names).To(HaveLen(2))
				evict := func(name string) error {
					return cluster.Client.PolicyV1().Evictions(shop).Evict(ctx, &policyv1.Eviction{
						ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: shop},
					})
				}
				Expect(evict(names[0])).To(Succeed())
				f.inject("evicted %s", names[0])
				err := evict(names[1])
				Expect(apierrors.IsTooManyRequests(err)).To(BeTrue(), "the second eviction: %v", err)
				f.note("evicting %s at once was refused: %v", names[1], err)
				waitDrainers(ctx, f, 2)
				Eventually(func() error { return evict(names[1]) }, time.Minute, 200*time.Millisecond).Should(Succeed())
				f.timeline.Mark("evicted %s once the replacement was Ready", names[1])
				waitDrainers(ctx, f, 2)
			})
		})

		It("follows a rotated broker Secret: the drainers reconnect with the new user", func(ctx SpecContext) {
			check(ctx, "broker Secret rotated to a new RabbitMQ user", func(ctx context.Context, f *fault) {
				user, password := testenv.UniqueName("spillway_fleet"), testenv.UniqueName("pw")
				rabbitUsers = append(rabbitUsers, user)
				mustRabbitmqctl("add_user", user, password)
				mustRabbitmqctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")
				rotated := fmt.Sprintf("amqp://%s:%s@127.0.0.1:5672/", user, password)
				patch, err := json.Marshal(map[string]any{"stringData": map[string]string{"url": rotated}})
				Expect(err).NotTo(HaveOccurred())
				mustRun("kubectl", "patch", "secret", "orders-rabbitmq", "--namespace", shop, "--type=merge", "-p", string(patch))
				f.inject("the Secret orders-rabbitmq now names RabbitMQ user %s", user)
				drainers := readyPods(ctx, shop, drainerLabels)
				Eventually(func(g Gomega) {
					for _, p := range pods(ctx, shop, drainerLabels) {
						data, err := os.ReadFile(filepath.Join(cluster.Node.Dir(), "pods", string(p.UID), "volumes", "broker-url", "url"))
						g.Expect(err).NotTo(HaveOccurred())
						g.Expect(string(data)).To(Equal(rotated))
					}
				}, time.Minute, 200*time.Millisecond).Should(Succeed())
				f.timeline.Mark("the new URL is mounted in both drainer pods")
				// A drainer reads the URL again when it reconnects: cut its
				// connections, the fleet's own, still logged in as guest.
				closed := 0
				for _, c := range drainerConnections(drainers) {
					if c.user != user {
						mustRabbitmqctl("close_connection", c.pid, "spillway fleet suite: broker Secret rotated")
						closed++
					}
				}
				f.timeline.Mark("closed the drainers' %d connections", closed)
				Eventually(func(g Gomega) {
					conns := drainerConnections(drainers)
					g.Expect(conns).To(HaveLen(len(drainers)))
					for _, c := range conns {
						g.Expect(c.user).To(Equal(user))
					}
				}, 2*time.Minute, time.Second).Should(Succeed())
				f.note("both drainers reconnected as %s, read from the rotated Secret", user)
			})
		})

		It("goes unready while its outbox table is renamed away, says why in /readyz and in its Ready condition, and drains again once it is back, losing nothing", func(ctx SpecContext) {
			f := renameAway(ctx, env.outbox, env.ledger)
			env.faults = append(env.faults, f)
			Expect(f.lost).To(BeEmpty(), "events lost:\n%s", f.timeline)
		})

		It("garbage-collects a deleted OutboxDrainer's Deployment, pods, ServiceAccount, Service and PodDisruptionBudget, and loses no event", func(ctx SpecContext) {
			check(ctx, "OutboxDrainer deleted, then applied again", func(ctx context.Context, f *fault) {
				od := outboxDrainer(ctx)
				children := []client.Object{
					&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: fleetName, Namespace: shop}},
					&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: fleetName, Namespace: shop}},
					&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fleetName + "-metrics", Namespace: shop}},
					&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: fleetName, Namespace: shop}},
				}
				for _, c := range children {
					Expect(k8s.Get(ctx, client.ObjectKeyFromObject(c), c)).To(Succeed())
					Expect(c.GetOwnerReferences()).To(ContainElement(HaveField("UID", od.UID)))
				}
				mustRun("kubectl", "delete", "outboxdrainer", fleetName, "--namespace", shop, "--wait=false")
				f.inject("kubectl delete outboxdrainer %s", fleetName)
				for _, c := range children {
					Eventually(func() bool {
						return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(c), c))
					}, 2*time.Minute, 200*time.Millisecond).Should(BeTrue(), "%T %s", c, c.GetName())
					f.timeline.Mark("%T %s garbage-collected", c, c.GetName())
				}
				Eventually(func() []corev1.Pod { return pods(ctx, shop, drainerLabels) }, 2*time.Minute, 200*time.Millisecond).Should(BeEmpty())
				var sets appsv1.ReplicaSetList
				Expect(k8s.List(ctx, &sets, client.InNamespace(shop), client.MatchingLabels(drainerLabels))).To(Succeed())
				Expect(sets.Items).To(BeEmpty())
				f.timeline.Mark("its ReplicaSets and drainer pods are gone; the events wait in the outbox")
				out, err := runWithInput(sampleManifests(env.outbox.Table, env.topology.Exchange), "kubectl", "apply", "--namespace", shop, "-f", "-")
				Expect(err).NotTo(HaveOccurred(), out)
				f.timeline.Mark("the sample applied again")
				waitDrainers(ctx, f, 2)
			})
		})
	})
}

// waitRolledOut waits until the fleet's two drainer pods are new ones,
// Ready, run with arg, and the pods before are gone.
func waitRolledOut(ctx context.Context, f *fault, before []string, arg string) {
	waitPodsArgs(ctx, shop, before, ContainElement(arg))
	f.timeline.Mark("rolled out: 2 new drainer pods Ready with %s, the old ones gone", arg)
}

// waitRolledOutWithout is waitRolledOut for pods run without flag.
func waitRolledOutWithout(ctx context.Context, f *fault, before []string, flag string) {
	waitPodsArgs(ctx, shop, before, Not(ContainElement(HavePrefix(flag))))
	f.timeline.Mark("rolled out: 2 new drainer pods Ready without %s, the old ones gone", flag)
}

// waitPodsArgs waits until the fleet in namespace runs 2 new drainer pods,
// Ready, whose arguments match args.
func waitPodsArgs(ctx context.Context, namespace string, before []string, args types.GomegaMatcher) {
	Eventually(func(g Gomega) {
		list := pods(ctx, namespace, drainerLabels)
		g.Expect(list).To(HaveLen(2))
		for _, p := range list {
			g.Expect(ready(p)).To(BeTrue())
			g.Expect(before).NotTo(ContainElement(p.Name))
			g.Expect(p.Spec.Containers[0].Args).To(args)
		}
	}, 3*time.Minute, 200*time.Millisecond).Should(Succeed())
}
