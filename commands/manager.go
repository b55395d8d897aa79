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
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/spillway-io/spillway/controllers"
	"github.com/spillway-io/spillway/controllers/probe"
	"github.com/spillway-io/spillway/telemetry"
)

// managerOptions are spillway manager's flags.
type managerOptions struct {
	metricsAddr, metricsCertDir, probeAddr string
	metricsSecure, leaderElect             bool
	leaderElectionNamespace                string
	image, watchNamespaces, logLevel       string
	probe                                  probe.Options
	// apiQPS and apiBurst bound the operator's requests to the API server.
	apiQPS   float64
	apiBurst int
}

// managerFlags binds spillway manager's flags to o.
func managerFlags(o *managerOptions) *flag.FlagSet {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.StringVar(&o.metricsAddr, "metrics-addr", ":8080", "listen address of /metrics (0: off)")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", false,
		"serve /metrics over HTTPS, to clients the API server authenticates and authorizes (get on the /metrics non-resource URL)")
	fs.StringVar(&o.metricsCertDir, "metrics-cert-dir", "", "directory of tls.crt and tls.key for --metrics-secure (default: a self-signed certificate)")
	fs.StringVar(&o.probeAddr, "health-probe-addr", ":8081", "listen address of /healthz and /readyz")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "elect a leader, so that only one of several replicas reconciles")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election lease (default: the pod's)")
	fs.StringVar(&o.image, "drainer-image", os.Getenv("SPILLWAY_DRAINER_IMAGE"),
		"image of fleets that name none: the operator's own, so both run the same version (default $SPILLWAY_DRAINER_IMAGE)")
	fs.StringVar(&o.watchNamespaces, "watch-namespaces", "", "comma-separated namespaces whose OutboxDrainers to reconcile (default: all)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&o.probe.Concurrency, "probe-concurrency", 8, "outboxes read at once; failing ones share a quarter of it on top")
	fs.DurationVar(&o.probe.Timeout, "probe-timeout", 10*time.Second, "bound of one read of an outbox, and of its statements on the server")
	fs.IntVar(&o.probe.CountLimit, "probe-count-limit", 1_000_000, "pending rows a read counts at most; beyond it the status says at least")
	// controller-runtime's 20 requests a second fall short of a thousand
	// fleets' status writes, one per fleet every statusInterval, and a spec
	// change then waits behind them: make bench-operator measured a new
	// fleet's Deployment a minute and more late.
	fs.Float64Var(&o.apiQPS, "kube-api-qps", 100, "requests per second to the API server, sustained; the API server's priority and fairness still applies")
	fs.IntVar(&o.apiBurst, "kube-api-burst", 200, "requests to the API server in a burst above --kube-api-qps")
	return fs
}

// ManagerCommand is `spillway manager`: the operator.
func ManagerCommand(ctx context.Context, args []string) error {
	var o managerOptions
	fs := managerFlags(&o)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.image == "" {
		return errors.New("drainer-image: Required value: set --drainer-image or SPILLWAY_DRAINER_IMAGE to the operator's own image")
	}
	level, err := parseLogLevel(o.logLevel)
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
	cfg.QPS, cfg.Burst = float32(o.apiQPS), o.apiBurst
	metricsOpts := metricsserver.Options{BindAddress: o.metricsAddr}
	if o.metricsSecure {
		metricsOpts.SecureServing = true
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
		metricsOpts.CertDir = o.metricsCertDir
	}
	var namespaces []string
	for ns := range strings.SplitSeq(o.watchNamespaces, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			namespaces = append(namespaces, ns)
		}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controllers.CacheOptions(namespaces),
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  o.probeAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "operator.spillway.io",
		LeaderElectionNamespace: o.leaderElectionNamespace,
		// A new leader starts at once when the old one stops cleanly.
		LeaderElectionReleaseOnCancel: true,
		// When it does not (a node lost, a process killed), its lease runs
		// out 8 s after the standby last saw it renewed, and a standby that
		// tries every second takes over soon after: client-go's 15 s lease
		// took up to 17 s in make bench-operator, and a 10 s one with 2 s
		// tries up to 16 s under a thousand fleets' load.
		LeaseDuration: ptr.To(8 * time.Second),
		RenewDeadline: ptr.To(6 * time.Second),
		RetryPeriod:   ptr.To(time.Second),
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
	tracing, stopTracing, err := telemetry.Start(ctx, "spillway-operator")
	if err != nil {
		return err
	}
	defer flushSpans(stopTracing, slog.Default())
	if err := controllers.Setup(ctx, mgr, scheme, controllers.Options{Image: o.image, Probe: o.probe, Tracing: tracing}); err != nil {
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
