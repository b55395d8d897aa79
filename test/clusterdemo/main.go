// Command clusterdemo is make demo: Spillway as a user meets it, on a local
// cluster whose pods run as processes of this machine (test/kubeenv's
// StartCluster) that pull Spillway's image (make image) from the cluster's
// registry. It installs the chart with helm, migrates an outbox,
// applies config/samples against the local Postgres and RabbitMQ, writes
// events, prints kubectl get outboxdrainers every second until the backlog
// is 0, scales the fleet up, and tears everything down.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/spillway-io/spillway/test/kubeenv"
	"github.com/spillway-io/spillway/test/testenv"
)

type options struct {
	spillway, helm, imageLayout string
	events                      int
	timeout, tick               time.Duration
}

// The sample's fleet.
const (
	namespace = "shop"
	fleet     = "orders"
	chart     = "charts/spillway"
)

// parseFlags uses a flag set of its own: testenv's Ginkgo import puts its
// flags on the default one.
func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("clusterdemo", flag.ContinueOnError)
	fs.StringVar(&o.spillway, "spillway", "bin/spillway", "the spillway binary (make build), for spillway migrate on this machine")
	fs.StringVar(&o.imageLayout, "image-layout", "", "the OCI layout of Spillway's image (make image; default bin/image), which the cluster's registry serves")
	fs.StringVar(&o.helm, "helm", "", "the helm binary (make helm)")
	fs.IntVar(&o.events, "events", 50_000, "events to write")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up on a step that takes longer")
	fs.DurationVar(&o.tick, "progress", time.Second, "interval of kubectl get outboxdrainers")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: clusterdemo [flags]\n\nRuns the chart and a fleet on a local cluster of processes (as root: each pod")
		fmt.Fprintln(fs.Output(), "gets namespaces of its own). KUBEBUILDER_ASSETS names the cluster's binaries,")
		fmt.Fprintln(fs.Output(), "which hack/control-plane.sh builds and prints.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.helm == "" {
		return o, errors.New("-helm is required: make demo passes the helm it builds")
	}
	if o.events < 1 || o.tick <= 0 {
		return o, errors.New("-events and -progress must be positive")
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err == nil && os.Geteuid() != 0 {
		err = errors.New("the local cluster's node gives each pod mount and network namespaces of its own, which needs root")
	}
	if err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = run(ctx, o, os.Stdout)
		stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// demo is one run: the services, the cluster, and what the steps share.
type demo struct {
	o        options
	out      io.Writer
	services testenv.Services
	cluster  *kubeenv.Cluster
	outbox   testenv.Outbox
}

func run(ctx context.Context, o options, out io.Writer) (err error) {
	start := time.Now()
	d := &demo{o: o, out: out}
	if d.services, err = testenv.Connect(ctx); err != nil {
		return err
	}
	defer d.services.Close()
	ch, err := d.services.Broker.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	topology, err := testenv.DeclareTopology(ch, "#", nil)
	if err != nil {
		return err
	}
	defer topology.Delete(ch)
	d.outbox = testenv.Outbox{DB: d.services.DB, Table: "public." + testenv.UniqueName("spillway_demo")}
	defer func() { _, _ = d.services.DB.Exec(context.Background(), "DROP TABLE IF EXISTS "+d.outbox.Table) }()

	fmt.Fprintf(out, "Spillway demo: the chart and a fleet of 2 drainers on a local cluster whose pods are processes; %d events\n", o.events)
	if o.imageLayout == "" {
		if o.imageLayout, err = kubeenv.ImageLayout(); err != nil {
			return err
		}
	}
	d.cluster, err = kubeenv.StartCluster(ctx, kubeenv.ClusterOptions{ImageLayout: o.imageLayout, Progress: out})
	if d.cluster != nil {
		defer func() {
			stopErr := d.cluster.Stop()
			if err == nil && stopErr == nil {
				_ = d.cluster.RemoveDir()
				fmt.Fprintln(out, "tore down the cluster; removed the demo's table, exchange and queue")
				return
			}
			err = errors.Join(err, stopErr)
			fmt.Fprintf(os.Stderr, "demo: the cluster's logs are kept in %s:\n  %s\n", d.cluster.Dir, strings.Join(d.cluster.LogFiles(), "\n  "))
		}()
	}
	if err != nil {
		return err
	}

	if err := d.install(ctx); err != nil {
		return err
	}
	if err := d.applyFleet(ctx, topology.Exchange); err != nil {
		return err
	}
	drained, err := d.drain(ctx)
	if err != nil {
		return err
	}
	queued, err := testenv.QueueDepth(ch, topology.Queue)
	if err != nil {
		return err
	}
	published, err := d.outbox.PublishedBy(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "drained %d events in %s (%.0f/s), published by %s; the queue holds %d messages\n",
		o.events, drained.Round(100*time.Millisecond), float64(o.events)/drained.Seconds(), formatCounts(published), queued)
	if err := d.scaleUp(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "the demo took %s\n", time.Since(start).Round(time.Second))
	return nil
}

// sh runs kubectl or helm against the cluster, showing the command as a
// user would type it and, unless quiet, its output.
func (d *demo) sh(ctx context.Context, show bool, stdin, name string, args ...string) (string, error) {
	bin := d.cluster.Kubectl
	if name == "helm" {
		bin = d.o.helm
	}
	cmd := d.cluster.Command(bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	output, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	if show {
		fmt.Fprintf(d.out, "$ %s %s\n%s", name, strings.Join(args, " "), output)
	}
	if err != nil {
		return string(output), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, output)
	}
	return string(output), nil
}

func (d *demo) install(ctx context.Context) error {
	// Restricted, as config/default labels it.
	for _, ns := range []string{"spillway-system", namespace} {
		if _, err := d.cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
		}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	// The chart's default image is the public one; here it is the
	// registry's, by digest.
	images := d.cluster.Images
	repo, digest, _ := strings.Cut(images.Spillway, "@")
	values := []string{"--set", "image.repository=" + repo, "--set", "image.digest=" + digest, "--set", "test.image=" + images.Kubectl}
	out, err := d.sh(ctx, false, "", "helm", append([]string{"install", "spillway", chart, "--namespace", "spillway-system", "--wait", "--timeout", d.o.timeout.String()}, values...)...)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "$ helm install spillway %s --namespace spillway-system --wait %s\n", chart, strings.Join(values[:4], " "))
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "STATUS:") || strings.HasPrefix(line, "NAME:") {
			fmt.Fprintln(d.out, line)
		}
	}
	return d.showImages(ctx, "spillway-system")
}

func (d *demo) applyFleet(ctx context.Context, exchange string) error {
	cmd := exec.CommandContext(ctx, d.o.spillway, "migrate", "--notify", "--database-url", testenv.DatabaseURL(), "--table", d.outbox.Table)
	output, err := cmd.CombinedOutput()
	fmt.Fprintf(d.out, "$ spillway migrate --notify --table %s\n%s", d.outbox.Table, output)
	if err != nil {
		return fmt.Errorf("spillway migrate: %w", err)
	}
	manifests, err := testenv.SampleFleet(d.outbox.Table, exchange, "1s")
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "config/samples with the local Postgres and RabbitMQ, table %s, exchange %s, status every second:\n", d.outbox.Table, exchange)
	if _, err := d.sh(ctx, true, manifests, "kubectl", "apply", "--namespace", namespace, "-f", "-"); err != nil {
		return err
	}
	if err := d.waitDrainers(ctx, 2); err != nil {
		return err
	}
	return d.showImages(ctx, namespace)
}

// showImages shows the pods' image and the digest the node pulled, and the
// pull in the first pod's events: the operator's pulls the image, the
// drainers' find it on the node.
func (d *demo) showImages(ctx context.Context, namespace string) error {
	out, err := d.sh(ctx, true, "", "kubectl", "get", "pods", "--namespace", namespace, "--sort-by=.metadata.name", "--output",
		"custom-columns=NAME:.metadata.name,STATUS:.status.phase,IMAGE:.spec.containers[0].image,IMAGE ID:.status.containerStatuses[0].imageID")
	if err != nil {
		return err
	}
	rows := testenv.ParseTable(out)
	if len(rows) == 0 {
		return fmt.Errorf("no pod in namespace %s to describe", namespace)
	}
	pod := rows[0]["NAME"]
	out, err = d.sh(ctx, false, "", "kubectl", "describe", "pod", pod, "--namespace", namespace)
	if err != nil {
		return err
	}
	_, events, _ := strings.Cut(out, "Events:")
	fmt.Fprintf(d.out, "$ kubectl describe pod %s --namespace %s   # its events\nEvents:%s", pod, namespace, events)
	return nil
}

// waitDrainers waits until n drainer pods are Running and Ready, and no
// other is left.
func (d *demo) waitDrainers(ctx context.Context, n int) error {
	ctx, cancel := context.WithTimeout(ctx, d.o.timeout)
	defer cancel()
	for {
		pods, err := d.cluster.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/component=drainer,app.kubernetes.io/instance=" + fleet,
		})
		if err == nil && len(pods.Items) == n && allReady(pods.Items) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d Ready drainer pods: %w", n, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func allReady(pods []corev1.Pod) bool {
	for _, p := range pods {
		ready := false
		for _, c := range p.Status.Conditions {
			ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
		}
		if !ready || p.DeletionTimestamp != nil {
			return false
		}
	}
	return true
}

// drain writes the events and prints kubectl get outboxdrainers every tick
// until the outbox holds no pending row and the status, read after that,
// shows a backlog of 0. The status is written only when a read changes it,
// so its lastProbeTime cannot date the read: a fleet that drains the events
// between two reads leaves it as it was, showing 0 throughout.
func (d *demo) drain(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	if _, err := d.outbox.Insert(ctx, d.o.events); err != nil {
		return 0, err
	}
	fmt.Fprintf(d.out, "wrote %d events into %s\n$ kubectl get outboxdrainers --namespace %s   # every %s\n", d.o.events, d.outbox.Table, namespace, d.o.tick)
	ctx, cancel := context.WithTimeout(ctx, d.o.timeout)
	defer cancel()
	ticker := time.NewTicker(d.o.tick)
	defer ticker.Stop()
	for first := true; ; first = false {
		pending, err := d.outbox.Backlog(ctx)
		if err != nil {
			return 0, err
		}
		out, err := d.sh(ctx, false, "", "kubectl", "get", "outboxdrainers", "--namespace", namespace)
		if err != nil {
			return 0, err
		}
		lines := strings.SplitN(strings.TrimRight(out, "\n"), "\n", 2)
		if first {
			fmt.Fprintf(d.out, "%7s  %s\n", "", lines[0])
		}
		rows := testenv.ParseTable(out)
		if len(lines) == 2 && len(rows) == 1 {
			fmt.Fprintf(d.out, "%6.1fs  %s\n", time.Since(start).Seconds(), lines[1])
			if pending == 0 && rows[0]["BACKLOG"] == "0" {
				return time.Since(start), nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("the backlog did not reach 0: %w", ctx.Err())
		case <-ticker.C:
		}
	}
}

func (d *demo) scaleUp(ctx context.Context) error {
	if _, err := d.sh(ctx, true, "", "kubectl", "scale", "outboxdrainer", fleet, "--namespace", namespace, "--replicas=3"); err != nil {
		return err
	}
	if err := d.waitDrainers(ctx, 3); err != nil {
		return err
	}
	if _, err := d.sh(ctx, true, "", "kubectl", "get", "pods", "--namespace", namespace); err != nil {
		return err
	}
	// The status catches up within its interval.
	ctx, cancel := context.WithTimeout(ctx, d.o.timeout)
	defer cancel()
	for {
		out, err := d.sh(ctx, false, "", "kubectl", "get", "outboxdrainers", "--namespace", namespace)
		if err != nil {
			return err
		}
		if rows := testenv.ParseTable(out); len(rows) == 1 && rows[0]["REPLICAS"] == "3" && rows[0]["READY"] == "True" {
			fmt.Fprintf(d.out, "$ kubectl get outboxdrainers --namespace %s\n%s", namespace, out)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the status did not show 3 replicas: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// formatCounts lists a count per drainer, by name.
func formatCounts(m map[string]int) string {
	var names []string
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	var parts []string
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s %d", name, m[name]))
	}
	return strings.Join(parts, ", ")
}
