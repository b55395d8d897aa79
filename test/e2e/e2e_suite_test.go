// Package e2e runs Spillway as a user does, on a local cluster whose pods
// run as processes (kubeenv.StartCluster): helm install, kubectl apply an
// OutboxDrainer, drain an outbox, helm test; then the fleet's faults, each
// with events flowing, each accounted for by message_id.
package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/controllers"
	"github.com/spillway-io/spillway/test/kubeenv"
	"github.com/spillway-io/spillway/test/pgha"
	"github.com/spillway-io/spillway/test/rabbitcluster"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "End-to-end Suite: the local cluster", Label(tier.Cluster))
}

const chart = "charts/spillway"

var (
	cluster  *kubeenv.Cluster
	services testenv.Services
	// k8s reads and writes straight to the API server.
	k8s client.Client
	// helm is the binary make builds into bin/ at a pinned version.
	helm string
	// spillwayImage is make image's image in the cluster's registry, by
	// digest: the chart's default image is the public reference, which
	// helmImage overrides.
	spillwayImage string
	// failed keeps the cluster's directory, with every log, after the run.
	failed bool
	// receiver is the webhook fleet's endpoint, a process on the host that
	// the pods reach as they reach the database; collector takes its spans.
	receiver  *testenv.Receiver
	collector *testenv.Collector
)

var _ = BeforeSuite(func(ctx SpecContext) {
	helm = os.Getenv("HELM")
	Expect(helm).NotTo(BeEmpty(), "HELM is not set: make test builds helm into bin/ and sets it")

	layout, err := kubeenv.ImageLayout()
	Expect(err).NotTo(HaveOccurred())
	receiver, err = testenv.StartReceiver(testenv.NewSecret())
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(receiver.Stop)
	collector, err = testenv.StartCollector()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(collector.Stop)
	cluster, err = kubeenv.StartCluster(ctx, kubeenv.ClusterOptions{
		// The broker cluster's nodes (AMQP and AMQPS), the database primary
		// and replica and PgBouncer, for the fleets that use them.
		// And the webhook receiver, and the collector of its fleet's spans.
		Forward:     append(append(append(rabbitcluster.Addrs(), rabbitcluster.TLSAddrs()...), pgha.Addrs()...), receiver.Addr(), collector.Addr()),
		ImageLayout: layout,
		Progress:    GinkgoWriter,
	})
	if cluster != nil {
		DeferCleanup(func() {
			Expect(cluster.Stop()).To(Succeed())
			if !failed {
				Expect(cluster.RemoveDir()).To(Succeed())
			} else {
				fmt.Fprintf(os.Stderr, "fleet: the cluster's logs are kept in %s\n", cluster.Dir)
			}
		})
	}
	Expect(err).NotTo(HaveOccurred())
	spillwayImage = cluster.Images.Spillway

	scheme, err := controllers.NewScheme()
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.New(cluster.Config, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	services, err = testenv.Connect(ctx)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(services.Close)
}, NodeTimeout(15*time.Minute))

// A failed spec names the files of every log: each container's output and
// the control plane's.
var _ = JustAfterEach(func() {
	if CurrentSpecReport().Failed() && cluster != nil {
		failed = true
		AddReportEntry("logs", strings.Join(cluster.LogFiles(), "\n"))
		AddReportEntry("the end of each container's log written during the spec", logTails(CurrentSpecReport().StartTime, 30))
	}
})

// logTails is the last n lines of each container log written to since
// start: a run in CI does not keep the cluster's directory.
func logTails(start time.Time, n int) string {
	if cluster.Node == nil {
		return ""
	}
	var b strings.Builder
	for _, l := range cluster.Node.Logs() {
		info, err := os.Stat(l.Path)
		if err != nil || info.ModTime().Before(start) {
			continue
		}
		out, err := os.ReadFile(l.Path)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
		fmt.Fprintf(&b, "== pod %s/%s, container %s ==\n%s\n", l.Namespace, l.Pod, l.Container, strings.Join(lines[max(len(lines)-n, 0):], "\n"))
	}
	return b.String()
}

// helmImages are the values that point the chart at the cluster's
// registry, by digest: the operator's image, and so its fleets', and the
// helm test's kubectl.
func helmImages() []string {
	repo, digest, _ := strings.Cut(spillwayImage, "@")
	return []string{"--set", "image.repository=" + repo, "--set", "image.digest=" + digest,
		"--set", "test.image=" + cluster.Images.Kubectl}
}

// run runs kubectl ("kubectl" means the cluster's) or helm against the
// cluster and returns its combined output.
func run(name string, args ...string) (string, error) {
	return runWithInput("", name, args...)
}

func runWithInput(stdin, name string, args ...string) (string, error) {
	bin := name
	switch name {
	case "kubectl":
		bin = cluster.Kubectl
	case "helm":
		bin = helm
	}
	cmd := cluster.Command(bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	GinkgoWriter.Printf("$ %s %s\n%s\n", name, strings.Join(args, " "), out)
	return string(out), err
}

func mustRun(name string, args ...string) string {
	out, err := run(name, args...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), out)
	return out
}

// namespace creates a namespace that enforces the restricted Pod Security
// Standard, as config/default's does.
func namespace(ctx context.Context, name string) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
	}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	return name
}

// pods lists the pods of a namespace that match labels.
func pods(ctx context.Context, namespace string, labels map[string]string) []corev1.Pod {
	var list corev1.PodList
	Expect(k8s.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels(labels))).To(Succeed())
	return list.Items
}

// ready says whether a pod is Running and Ready.
func ready(p corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// readyPods are the names of the Running and Ready pods matching labels.
func readyPods(ctx context.Context, namespace string, labels map[string]string) []string {
	var names []string
	for _, p := range pods(ctx, namespace, labels) {
		if ready(p) {
			names = append(names, p.Name)
		}
	}
	return names
}

// logOf is the output of a pod's container, every run, as the node kept it.
func logOf(namespace, pod, container string) string {
	var b strings.Builder
	for _, l := range cluster.Node.Logs() {
		if l.Namespace == namespace && l.Pod == pod && l.Container == container {
			data, err := os.ReadFile(l.Path)
			Expect(err).NotTo(HaveOccurred())
			b.Write(data)
		}
	}
	return b.String()
}
