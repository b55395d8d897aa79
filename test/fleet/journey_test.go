package fleet

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"
	amqp "github.com/rabbitmq/amqp091-go"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/test/testenv"
)

const (
	operatorNamespace = "spillway-system"
	release           = "spillway"
	shop              = "shop"
	fleetName         = "orders"
	journeyEvents     = 50_000
)

// drainerLabels select the sample fleet's drainer pods.
var drainerLabels = map[string]string{
	"app.kubernetes.io/name":      "spillway",
	"app.kubernetes.io/component": "drainer",
	"app.kubernetes.io/instance":  fleetName,
}

var operatorLabels = map[string]string{"app.kubernetes.io/component": "operator"}

func splitHostPort(raw string) (string, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", err
	}
	return u.Hostname(), u.Port(), nil
}

// sampleManifests are config/samples against the local services, the
// suite's table and exchange, with the status read every second.
func sampleManifests(table, exchange string) string {
	manifests, err := testenv.SampleFleet(table, exchange, "1s")
	Expect(err).NotTo(HaveOccurred())
	return manifests
}

// getOutboxDrainers runs kubectl get outboxdrainers, and parses its table.
func getOutboxDrainers(namespace string) (string, []map[string]string) {
	out := mustRun("kubectl", "get", "outboxdrainers", "--namespace", namespace)
	return out, testenv.ParseTable(out)
}

// tokenSubject is the subject of the service-account token the node
// mounted into a pod: who the pod's processes are to the API server.
func tokenSubject(pod corev1.Pod) string {
	paths, err := filepath.Glob(filepath.Join(cluster.Node.Dir(), "pods", string(pod.UID), "volumes", "kube-api-access-*", "token"))
	Expect(err).NotTo(HaveOccurred())
	Expect(paths).To(HaveLen(1), "the pod's projected service-account token")
	raw, err := os.ReadFile(paths[0])
	Expect(err).NotTo(HaveOccurred())
	parts := strings.Split(string(raw), ".")
	Expect(parts).To(HaveLen(3))
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	Expect(err).NotTo(HaveOccurred())
	var claims struct {
		Sub string `json:"sub"`
	}
	Expect(json.Unmarshal(payload, &claims)).To(Succeed())
	return claims.Sub
}

func leaseHolder(ctx context.Context) string {
	lease := &coordinationv1.Lease{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: "operator.spillway.io"}, lease); err != nil {
		return ""
	}
	if lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// holdsLease says whether the lease's holder is a process of pod: the
// manager's identity is its hostname, the pod's name, and a random suffix.
func holdsLease(ctx context.Context, pod string) bool {
	return strings.HasPrefix(leaseHolder(ctx), pod+"_")
}

func outboxDrainer(ctx context.Context) *v1alpha1.OutboxDrainer {
	od := &v1alpha1.OutboxDrainer{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: shop, Name: fleetName}, od)).To(Succeed())
	return od
}

var _ = Describe("Spillway on the local cluster", Ordered, Label("e2e"), func() {
	var (
		outbox   testenv.Outbox
		topology testenv.Topology
		ledger   *testenv.Ledger
		faults   faultLog
	)

	BeforeAll(func(ctx SpecContext) {
		ch, err := services.Broker.Channel()
		Expect(err).NotTo(HaveOccurred())
		topology, err = testenv.DeclareTopology(ch, "#", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { topology.Delete(ch); ch.Close() })
		ledger, err = testenv.StartLedger(services.Broker, topology.Queue)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(ledger.Stop)
		outbox = testenv.Outbox{DB: services.DB, Table: "public." + testenv.UniqueName("fleet_outbox")}
		DeferCleanup(func(ctx SpecContext) {
			_, err := services.DB.Exec(ctx, "DROP TABLE IF EXISTS "+outbox.Table)
			Expect(err).NotTo(HaveOccurred())
		})
	})

	AfterAll(func() {
		if len(faults) > 0 {
			AddReportEntry("fleet faults", faults.String())
			fmt.Fprint(GinkgoWriter, faults.String())
		}
	})

	It("installs the chart with helm: the operator pod runs as the chart's ServiceAccount, turns Ready and takes its leader lease", func(ctx SpecContext) {
		namespace(ctx, operatorNamespace)
		mustRun("helm", "install", release, chart, "--namespace", operatorNamespace, "--wait", "--timeout", "3m")

		var operator corev1.Pod
		Eventually(func(g Gomega) {
			list := pods(ctx, operatorNamespace, operatorLabels)
			g.Expect(list).To(HaveLen(1))
			operator = list[0]
			g.Expect(ready(operator)).To(BeTrue(), "Running and Ready")
		}, 2*time.Minute).Should(Succeed())
		Expect(operator.Spec.Containers[0].Image).To(Equal(spillwayImage))
		Expect(operator.Spec.ServiceAccountName).To(Equal(release))
		Expect(tokenSubject(operator)).To(Equal("system:serviceaccount:"+operatorNamespace+":"+release),
			"its only credential is the chart's ServiceAccount's token")
		Eventually(func() bool { return holdsLease(ctx, operator.Name) }, time.Minute).Should(BeTrue(),
			"the lease operator.spillway.io is held by the operator pod's manager")
		Expect(logOf(operatorNamespace, operator.Name, "manager")).NotTo(ContainSubstring("forbidden"))
	})

	It("migrates the outbox with spillway migrate in a pod that runs to completion", func(ctx SpecContext) {
		namespace(ctx, shop)
		migrate := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "spillway-migrate", Namespace: shop},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				SecurityContext: &corev1.PodSecurityContext{
					RunAsNonRoot:   ptrTo(true),
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				Containers: []corev1.Container{{
					Name:  "migrate",
					Image: spillwayImage,
					Args:  []string{"migrate", "--database-url=" + testenv.DatabaseURL(), "--table=" + outbox.Table, "--notify"},
					SecurityContext: &corev1.SecurityContext{
						AllowPrivilegeEscalation: ptrTo(false),
						Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					},
				}},
			},
		}
		Expect(k8s.Create(ctx, migrate)).To(Succeed())
		Eventually(func(g Gomega) {
			got, err := getPod(ctx, migrate)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got.Status.Phase).To(Equal(corev1.PodSucceeded))
		}, 2*time.Minute).Should(Succeed())
		Expect(logOf(shop, "spillway-migrate", "migrate")).To(ContainSubstring("created table " + outbox.Table))
	})

	It("applies the sample Secrets and an OutboxDrainer of two replicas: two drainer pods turn Ready", func(ctx SpecContext) {
		out, err := runWithInput(sampleManifests(outbox.Table, topology.Exchange), "kubectl", "apply", "--namespace", shop, "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("outboxdrainer.spillway.io/orders created"))
		Eventually(func() []string { return readyPods(ctx, shop, drainerLabels) }, 2*time.Minute).Should(HaveLen(2))
		for _, p := range pods(ctx, shop, drainerLabels) {
			Expect(p.Spec.Containers[0].Image).To(Equal(spillwayImage), "the operator's own image, from --drainer-image")
		}
	})

	It("drains 50,000 events: kubectl get outboxdrainers shows the backlog fall to 0, READY True and REPLICAS 2, and every event reaches the queue", func(ctx SpecContext) {
		drainers := readyPods(ctx, shop, drainerLabels)
		start := time.Now()
		ids, err := outbox.Insert(ctx, journeyEvents)
		Expect(err).NotTo(HaveOccurred())
		claimants := map[string]bool{}
		var table []string
		var backlogs []int
		Eventually(func(g Gomega) {
			claims, err := outbox.Claims(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			for by := range claims {
				claimants[by] = true
			}
			out, rows := getOutboxDrainers(shop)
			g.Expect(rows).To(HaveLen(1))
			row := rows[0]
			if len(table) == 0 {
				table = append(table, strings.SplitN(out, "\n", 2)[0])
			}
			table = append(table, fmt.Sprintf("%5.1fs  %s", time.Since(start).Seconds(), strings.TrimSpace(strings.SplitN(out, "\n", 2)[1])))
			if b, err := strconv.Atoi(row["BACKLOG"]); err == nil {
				backlogs = append(backlogs, b)
			}
			// The status is read every second: first it shows the events.
			g.Expect(slices.ContainsFunc(backlogs, func(b int) bool { return b > 0 })).To(BeTrue(), "the status shows the seeded events")
			g.Expect(row["BACKLOG"]).To(Equal("0"))
			g.Expect(row["READY"]).To(Equal("True"))
			g.Expect(row["REPLICAS"]).To(Equal("2"))
		}, 5*time.Minute, time.Second).Should(Succeed())
		drained := time.Since(start)
		AddReportEntry("kubectl get outboxdrainers, every second", strings.Join(table, "\n"))

		Eventually(func() (int, error) { return ledger.Missing(ids) }, time.Minute).Should(BeZero(), "every event reached the queue")
		lost, duplicates := ledger.Account(ids)
		Expect(lost).To(BeEmpty())
		published, err := outbox.PublishedBy(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(published).To(HaveLen(2))
		for _, d := range drainers {
			Expect(published).To(HaveKeyWithValue(d, BeNumerically(">", 0)), "claimed_by holds the drainers' pod names")
			Expect(claimants).To(HaveKey(d), "claimed_by showed the pod names while it drained")
		}
		AddReportEntry("journey", fmt.Sprintf("%d events drained in %s (%.0f/s) by %v; lost %d, duplicates %d",
			journeyEvents, drained.Round(100*time.Millisecond), float64(journeyEvents)/drained.Seconds(), published, len(lost), duplicates))
	})

	It("passes helm test, whose hook pod runs kubectl on the node", func(ctx SpecContext) {
		out := mustRun("helm", "test", release, "--namespace", operatorNamespace, "--timeout", "3m")
		Expect(out).To(MatchRegexp(`TEST SUITE:\s+spillway-test`))
		Expect(out).To(MatchRegexp(`Phase:\s+Succeeded`))
		Expect(logOf(operatorNamespace, "spillway-test", "operator-available")).To(ContainSubstring("condition met"))
		Expect(logOf(operatorNamespace, "spillway-test", "crd-served")).To(ContainSubstring("No resources found"))
	})

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
			f := runFault(ctx, name, outbox, ledger, inject)
			faults = append(faults, f)
			Expect(f.lost).To(BeEmpty(), "events lost:\n%s", f.timeline)
			return f
		}

		It("survives a drainer pod deleted mid-drain", func(ctx SpecContext) {
			check(ctx, "drainer pod deleted", func(ctx context.Context, f *fault) {
				victim, claimed := drainerWithClaims(ctx, outbox)
				mustRun("kubectl", "delete", "pod", victim, "--namespace", shop, "--wait=false")
				f.inject("kubectl delete pod %s, which held %d claims", victim, len(claimed))
				waitPublished(ctx, f, outbox, victim, claimed)
				waitGone(ctx, f, victim)
				waitDrainers(ctx, f, 2)
			})
		})

		It("survives a drainer pod force-deleted mid-drain", func(ctx SpecContext) {
			check(ctx, "drainer pod force-deleted", func(ctx context.Context, f *fault) {
				victim, claimed := drainerWithClaims(ctx, outbox)
				mustRun("kubectl", "delete", "pod", victim, "--namespace", shop, "--grace-period=0", "--force")
				f.inject("kubectl delete pod %s --grace-period=0 --force, which held %d claims", victim, len(claimed))
				// The pod is gone from the API at once, but its node, as a
				// kubelet does, still stops its process with SIGTERM and
				// the grace period of its spec: the drainer releases its
				// claims as it stops.
				waitPublished(ctx, f, outbox, victim, claimed)
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
				victim, claimed = drainerWithClaims(ctx, outbox)
				// A hung node: the process runs no more and releases nothing.
				Expect(cluster.Node.Signal(shop, victim, "drainer", syscall.SIGSTOP)).To(Succeed())
				mustRun("kubectl", "delete", "pod", victim, "--namespace", shop, "--grace-period=0", "--force")
				f.inject("%s frozen (SIGSTOP), then force-deleted, holding %d claims", victim, len(claimed))
				// The operator sees the pod gone and releases its claims;
				// the lease alone would hold them for three minutes.
				Eventually(func() (int, error) { claims, err := outbox.Claims(ctx); return claims[victim], err },
					time.Minute, 20*time.Millisecond).Should(BeZero())
				f.timeline.Mark("%s holds no claim any more", victim)
				f.released = waitPublished(ctx, f, outbox, victim, claimed)
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
			Expect(ledger.Latest().Type).NotTo(BeEmpty(), "full properties before")
			check(ctx, "messageProperties Full -> Compact (rolling update)", func(ctx context.Context, f *fault) {
				before := readyPods(ctx, shop, drainerLabels)
				mustRun("kubectl", "patch", "outboxdrainer", fleetName, "--namespace", shop, "--type=merge", "-p", `{"spec":{"broker":{"messageProperties":"Compact"}}}`)
				f.inject("kubectl patch outboxdrainer %s: messageProperties Full -> Compact", fleetName)
				waitRolledOut(ctx, f, before, "--message-properties=compact")
				// The old pods are gone: what arrives now, the new ones sent.
				Eventually(func(g Gomega) {
					m := ledger.Latest()
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
			published, err := outbox.PublishedBy(ctx)
			Expect(err).NotTo(HaveOccurred())
			for _, pod := range rolled {
				Expect(published).NotTo(HaveKey(pod), "rows %s marked published instead of deleting them", pod)
			}
			Eventually(func(g Gomega) {
				published, err := outbox.PublishedBy(ctx)
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
				roster := outbox.Spec().RosterOthers()
				Eventually(func() (int, error) {
					var n int
					return n, outbox.DB.QueryRow(ctx, roster.SQL, roster.Args...).Scan(&n)
				}, time.Minute, 50*time.Millisecond).Should(Equal(2))
				ch, err := services.Broker.Channel()
				Expect(err).NotTo(HaveOccurred())
				defer ch.Close()
				Eventually(func() (int, error) { return testenv.QueueDepth(ch, topology.Queue) }, time.Minute, 50*time.Millisecond).Should(BeZero())
				backlog, err := outbox.Backlog(ctx)
				Expect(err).NotTo(HaveOccurred())
				from, start := ledger.Total(), time.Now()
				time.Sleep(15 * time.Second)
				rate := float64(ledger.Total()-from) / time.Since(start).Seconds()
				f.note("capped at %d/s, the two pods published %.0f/s together", capped, rate)
				Expect(rate).To(BeNumerically("<=", 1.25*capped), "the cap holds for the fleet")
				Expect(rate).To(BeNumerically(">=", 0.5*capped), "and lets it drain")
				Expect(outbox.Backlog(ctx)).To(BeNumerically(">", backlog), "the cap, not the traffic, set the pace: the backlog grew")

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
					from, start := ledger.Total(), time.Now()
					time.Sleep(3 * time.Second)
					return float64(ledger.Total()-from) / time.Since(start).Seconds()
				}
				Eventually(window, 2*time.Minute).Should(BeNumerically("<=", 1.5*slowest))
				f.timeline.Mark("the two pods publish at their slowest pace")
				backlog, err := outbox.Backlog(ctx)
				Expect(err).NotTo(HaveOccurred())
				from, start := ledger.Total(), time.Now()
				time.Sleep(10 * time.Second)
				rate := float64(ledger.Total()-from) / time.Since(start).Seconds()
				f.note("every commit slower than 1ns: the two pods published %.1f/s together", rate)
				Expect(rate).To(BeNumerically("<=", 1.5*slowest), "each pod holds to its slowest pace")
				Expect(rate).To(BeNumerically(">", 0), "and still drains, timing its commits")
				Expect(outbox.Backlog(ctx)).To(BeNumerically(">", backlog), "the guard, not the traffic, set the pace: the backlog grew")

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
				published := ledger.Total()
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
				drained := ledger.Total() - published
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
			f := renameAway(ctx, outbox, ledger)
			faults = append(faults, f)
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
				out, err := runWithInput(sampleManifests(outbox.Table, topology.Exchange), "kubectl", "apply", "--namespace", shop, "-f", "-")
				Expect(err).NotTo(HaveOccurred(), out)
				f.timeline.Mark("the sample applied again")
				waitDrainers(ctx, f, 2)
			})
		})
	})

	describeAutoscaling()
})

// waitRolledOut waits until the fleet's two drainer pods are new ones,
// Ready, run with arg, and the pods before are gone.
func waitRolledOut(ctx context.Context, f *fault, before []string, arg string) {
	waitPodsArgs(ctx, before, ContainElement(arg))
	f.timeline.Mark("rolled out: 2 new drainer pods Ready with %s, the old ones gone", arg)
}

// waitRolledOutWithout is waitRolledOut for pods run without flag.
func waitRolledOutWithout(ctx context.Context, f *fault, before []string, flag string) {
	waitPodsArgs(ctx, before, Not(ContainElement(HavePrefix(flag))))
	f.timeline.Mark("rolled out: 2 new drainer pods Ready without %s, the old ones gone", flag)
}

func waitPodsArgs(ctx context.Context, before []string, args types.GomegaMatcher) {
	Eventually(func(g Gomega) {
		list := pods(ctx, shop, drainerLabels)
		g.Expect(list).To(HaveLen(2))
		for _, p := range list {
			g.Expect(ready(p)).To(BeTrue())
			g.Expect(before).NotTo(ContainElement(p.Name))
			g.Expect(p.Spec.Containers[0].Args).To(args)
		}
	}, 3*time.Minute, 200*time.Millisecond).Should(Succeed())
}

func ptrTo[T any](v T) *T { return &v }
