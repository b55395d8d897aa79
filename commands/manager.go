package commands

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
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/spillway-io/spillway/controllers"
	"github.com/spillway-io/spillway/controllers/probe"
)

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

	scheme, err := controllers.NewScheme()
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
		Cache:                   controllers.CacheOptions(namespaces),
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
	if err := controllers.Setup(ctx, mgr, scheme, controllers.Options{Image: *image, Probe: probeOpts}); err != nil {
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
