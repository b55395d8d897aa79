package controllers

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

// NewScheme knows the built-in types and OutboxDrainer.
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

// ManagerCommand is `spillway manager`: the operator.
func ManagerCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	metricsAddr := fs.String("metrics-addr", ":8080", "listen address of /metrics (0: off)")
	probeAddr := fs.String("health-probe-addr", ":8081", "listen address of /healthz and /readyz")
	leaderElect := fs.Bool("leader-elect", false, "elect a leader, so that only one of several replicas reconciles")
	leaderElectionNamespace := fs.String("leader-election-namespace", "", "namespace of the leader election lease (default: the pod's)")
	image := fs.String("drainer-image", os.Getenv("SPILLWAY_DRAINER_IMAGE"),
		"image of fleets that name none: the operator's own, so both run the same version (default $SPILLWAY_DRAINER_IMAGE)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *image == "" {
		return errors.New("drainer-image: Required value: set --drainer-image or SPILLWAY_DRAINER_IMAGE to the operator's own image")
	}
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, nil)))

	scheme, err := NewScheme()
	if err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: *metricsAddr},
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
	}
	if err := reconciler.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	return mgr.Start(ctx)
}
