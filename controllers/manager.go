package controllers

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/probe"
	"github.com/spillway-io/spillway/controllers/resource"
)

// NewScheme knows the built-in types, OutboxDrainer and OutboxReplay.
func NewScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

// Leader election takes a Lease, and records events, in the operator's
// namespace only.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=spillway-system
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch,namespace=spillway-system

// Serving metrics securely asks the API server who a scraper is and whether
// it may read /metrics.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// CacheOptions scope the manager's cache: the children only where they
// carry the operator's label, and every object only in namespaces, when
// set. Without the label selector, the operator would cache every
// Deployment, Service, ServiceAccount and PodDisruptionBudget in the
// cluster. Of the drainer pods and of the nodes it keeps only what tells
// whether a drainer is dead.
func CacheOptions(namespaces []string) cache.Options {
	managed := labels.SelectorFromSet(labels.Set{resource.ManagedByLabel: resource.ManagedBy})
	drainers := labels.SelectorFromSet(labels.Set{resource.ManagedByLabel: resource.ManagedBy, resource.ComponentLabel: resource.Drainer})
	opts := cache.Options{ByObject: map[client.Object]cache.ByObject{
		&appsv1.Deployment{}:            {Label: managed},
		&corev1.Service{}:               {Label: managed},
		&corev1.ServiceAccount{}:        {Label: managed},
		&policyv1.PodDisruptionBudget{}: {Label: managed},
		&corev1.Pod{}:                   {Label: drainers, Transform: keepPodFields},
		&corev1.Node{}:                  {Transform: keepNodeFields},
	}}
	if len(namespaces) > 0 {
		opts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	return opts
}

// ManagerCommand is `spillway manager`: the operator.
func ManagerCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	metricsAddr := fs.String("metrics-addr", ":8080", "listen address of /metrics (0: off)")
	metricsSecure := fs.Bool("metrics-secure", false,
		"serve /metrics over HTTPS, to clients the API server authenticates and authorizes (get on the /metrics non-resource URL)")
	metricsCertDir := fs.String("metrics-cert-dir", "", "directory of tls.crt and tls.key for --metrics-secure (default: a self-signed certificate)")
	probeAddr := fs.String("health-probe-addr", ":8081", "listen address of /healthz and /readyz")
	leaderElect := fs.Bool("leader-elect", false, "elect a leader, so that only one of several replicas reconciles")
	leaderElectionNamespace := fs.String("leader-election-namespace", "", "namespace of the leader election lease (default: the pod's)")
	image := fs.String("drainer-image", os.Getenv("SPILLWAY_DRAINER_IMAGE"),
		"image of fleets that name none: the operator's own, so both run the same version (default $SPILLWAY_DRAINER_IMAGE)")
	watchNamespaces := fs.String("watch-namespaces", "", "comma-separated namespaces whose OutboxDrainers to reconcile (default: all)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	var probeOpts probe.Options
	fs.IntVar(&probeOpts.Concurrency, "probe-concurrency", 8, "outboxes read at once; failing ones share a quarter of it on top")
	fs.DurationVar(&probeOpts.Timeout, "probe-timeout", 10*time.Second, "bound of one read of an outbox, and of its statements on the server")
	fs.IntVar(&probeOpts.CountLimit, "probe-count-limit", 1_000_000, "pending rows a read counts at most; beyond it the status says at least")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *image == "" {
		return errors.New("drainer-image: Required value: set --drainer-image or SPILLWAY_DRAINER_IMAGE to the operator's own image")
	}
	level, err := parseLogLevel(*logLevel)
	if err != nil {
		return err
	}
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})))

	scheme, err := NewScheme()
	if err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	metricsOpts := metricsserver.Options{BindAddress: *metricsAddr}
	if *metricsSecure {
		metricsOpts.SecureServing = true
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
		metricsOpts.CertDir = *metricsCertDir
	}
	var namespaces []string
	for ns := range strings.SplitSeq(*watchNamespaces, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			namespaces = append(namespaces, ns)
		}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   CacheOptions(namespaces),
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  *probeAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "operator.spillway.io",
		LeaderElectionNamespace: *leaderElectionNamespace,
		// A new leader starts at once when the old one stops cleanly.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	reconciler := &OutboxDrainerReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Scheme:    scheme,
		Recorder:  mgr.GetEventRecorder("spillway-operator"),
		Image:     *image,
		Prober:    probe.New(mgr.GetAPIReader(), mgr.GetEventRecorder("spillway-operator"), probe.DefaultMetrics(), probeOpts),
	}
	if err := reconciler.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	replays := &OutboxReplayReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("spillway-operator"),
		Timeout:   probeOpts.Timeout,
		Prober:    reconciler.Prober,
	}
	if err := replays.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// parseLogLevel names a slog level; debug also turns on the reconciler's
// V(1) lines.
func parseLogLevel(name string) (slog.Level, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(name)); err != nil {
		return 0, fmt.Errorf("log-level: Unsupported value: %q: supported values: \"debug\", \"info\", \"warn\", \"error\"", name)
	}
	return level, nil
}
